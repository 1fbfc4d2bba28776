#pragma once
// One training or evaluation batch, for either front end of the model.
#include <cstdint>
#include <vector>

#include "train/model.hpp"

namespace mhla::train {

struct Batch {
  int64_t size = 0;              // samples
  std::vector<int32_t> tokens;   // [size, tokens] (token tasks)
  std::vector<float> patches;    // [size, tokens, patch_dim] (image tasks)
  std::vector<int32_t> targets;  // per token ([size, tokens]) or per sample ([size]); -1 = no label

  ModelInput<float> input() const {
    return {tokens.empty() ? nullptr : tokens.data(), patches.empty() ? nullptr : patches.data()};
  }
};

// Independent random streams from one seed: stream s of seed x is the same on
// every run, so batch s can be rebuilt after a resume without replaying 0..s-1.
uint64_t stream_seed(uint64_t seed, uint64_t stream);

}  // namespace mhla::train
