#pragma once
// Element-wise work on device arrays that the API's entry points ask of a
// backend: sums into gradients, and the bfloat16 and float16 <-> float
// conversions of the 16-bit operators where they compute in float.
#include <cuda_runtime.h>

#include <cstdint>

namespace mhla::cuda {

// to[i] += from[i]
template <typename T>
void add(const T* from, int64_t n, T* to, cudaStream_t stream);
// to[i] = float(from[i]), from as bfloat16 bit patterns (exact)
void widen(const uint16_t* from, int64_t n, float* to, cudaStream_t stream);
// to[i] = from[i] rounded to bfloat16, to nearest with ties to even; NaN stays
// NaN (the rounding of mhla/bfloat16.hpp)
void narrow(const float* from, int64_t n, uint16_t* to, cudaStream_t stream);
// The same for float16 bit patterns (__float2half_rn: the rounding of
// mhla/float16.hpp); narrowing sets *overflowed where a finite value becomes
// infinite (beyond 65504).
void widen_f16(const uint16_t* from, int64_t n, float* to, cudaStream_t stream);
void narrow_f16(const float* from, int64_t n, uint16_t* to, int* overflowed,
                cudaStream_t stream);

}  // namespace mhla::cuda
