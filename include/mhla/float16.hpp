#pragma once
// float16: IEEE binary16 (1 sign, 5 exponent and 10 fraction bits), the
// storage type of mixed-precision training on GPUs. The operator reads and
// writes it and computes in float32 (see mhla/operator.hpp). The conversions
// are written out rather than taken from the compiler's _Float16, which some
// compilers lack (clang 14 on x86).
#include <bit>
#include <cstdint>

namespace mhla {

struct float16 {
  uint16_t bits = 0;
};

// The largest finite float16; from 65520 up, float32 values round to infinity.
inline constexpr float kFloat16Max = 65504.0f;

// Exact: every float16 is a float32.
inline float to_float(float16 x) {
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, fraction = h & 0x3ffu;
  // All three readings, then a choice, so that loops over arrays vectorise:
  // the exponent rebiased from 15 to 127; infinity or NaN; zero or subnormal,
  // in units of 2^-24 (exact in float, and never a float subnormal, which
  // flush-to-zero modes would lose).
  const uint32_t normal = ((exponent + 112) << 23) | (fraction << 13);
  const uint32_t special = 0x7f800000u | (fraction << 13);
  const uint32_t small = std::bit_cast<uint32_t>(float(fraction) * 0x1p-24f);
  return std::bit_cast<float>(sign | (exponent == 0 ? small : exponent == 31 ? special : normal));
}

// Round to nearest, ties to even (as torch and CUDA's __float2half_rn round):
// from 65520 up to infinity; NaN stays NaN. Every reading is computed and
// one chosen, without branches, so that loops over arrays vectorise.
inline float16 to_float16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  // Normal: rebias the exponent, then round away the 13 extra fraction bits
  // (a carry into the exponent is the right result).
  const uint32_t rebiased = magnitude - 0x38000000u;
  const uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
  // Subnormal or zero: adding 0.5 (whose unit in the last place is 2^-24)
  // leaves the value in units of 2^-24 in the low bits, rounded to nearest
  // even by the addition itself; 1024 units is the smallest normal, 0x0400.
  const uint32_t small =
      std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3f000000u;
  const uint32_t bits = magnitude > 0x7f800000u    ? 0x7e00u
                        : magnitude >= 0x477ff000u ? 0x7c00u
                        : magnitude >= 0x38800000u ? normal
                                                   : small;
  return {uint16_t(sign | bits)};
}

}  // namespace mhla
