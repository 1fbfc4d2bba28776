#pragma once
// phi on float tiles as a SIMD kernel (compiled for every x86 instruction set,
// chosen at run time like cpu/simd/block_gemm.hpp). On AVX-512, elu+1's
// exponential is evaluated inline with the instruction set's rounding and
// exponent-scaling operations, within 1 ulp of exp and faster than glibc's
// vector expf; below AVX-512 glibc's expf is the faster, and the kernel uses
// it.
#include <cstdint>

#include "mhla/options.hpp"

namespace mhla::cpu::simd {

// tile[r * ld + c] = phi(src[r * ld_src + c]) for r < rows, c < width (src
// may be tile itself, with ld_src = ld). NaN stays NaN, -inf gives 0
// (elu+1), +inf stays +inf, and tiny results keep their subnormal values.
void apply_feature(FeatureMap phi, const float* src, int64_t ld_src, float* tile, int64_t rows,
                   int64_t width, int64_t ld);

}  // namespace mhla::cpu::simd
