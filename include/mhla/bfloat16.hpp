#pragma once
// bfloat16: the upper half of an IEEE float32 (8 exponent bits, 7 fraction
// bits), the storage type of reduced-precision training. The operator reads
// and writes it and computes in float32 (see mhla/operator.hpp).
#include <bit>
#include <cstdint>

namespace mhla {

struct bfloat16 {
  uint16_t bits = 0;
};

// Exact: every bfloat16 is a float32.
inline float to_float(bfloat16 x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }

// Round to nearest, ties to even (as torch rounds); NaN stays NaN.
inline bfloat16 to_bfloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return {(u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0u) : uint16_t(rounded)};
}

}  // namespace mhla
