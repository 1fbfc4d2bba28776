#include "train/batch.hpp"

namespace mhla::train {

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  // SplitMix64 finaliser over a combination of both: well-mixed, cheap, portable.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace mhla::train
