#include <cuda_fp16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/launch.cuh"
#include "cuda/elementwise.cuh"

namespace mhla::cuda {
namespace {

template <typename T>
__global__ void add_kernel(const T* from, int64_t n, T* to) {
  MHLA_GRID_STRIDE(i, n) to[i] += from[i];
}

__global__ void widen_kernel(const uint16_t* from, int64_t n, float* to) {
  MHLA_GRID_STRIDE(i, n) to[i] = __uint_as_float(uint32_t(from[i]) << 16);
}

__global__ void narrow_kernel(const float* from, int64_t n, uint16_t* to) {
  MHLA_GRID_STRIDE(i, n) {
    const uint32_t u = __float_as_uint(from[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    to[i] = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0u) : uint16_t(rounded);
  }
}

__global__ void widen_f16_kernel(const uint16_t* from, int64_t n, float* to) {
  MHLA_GRID_STRIDE(i, n) to[i] = __half2float(__ushort_as_half(from[i]));
}

__global__ void narrow_f16_kernel(const float* from, int64_t n, uint16_t* to, int* overflowed) {
  MHLA_GRID_STRIDE(i, n) {
    const __half h = __float2half_rn(from[i]);
    to[i] = __half_as_ushort(h);
    if (isfinite(from[i]) && __hisinf(h)) atomicOr(overflowed, 1);
  }
}

}  // namespace

template <typename T>
void add(const T* from, int64_t n, T* to, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(from, n, to);
  check_launch("add_kernel");
}
template void add<float>(const float*, int64_t, float*, cudaStream_t);
template void add<double>(const double*, int64_t, double*, cudaStream_t);

void widen(const uint16_t* from, int64_t n, float* to, cudaStream_t stream) {
  if (n == 0) return;
  widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(from, n, to);
  check_launch("widen_kernel");
}

void narrow(const float* from, int64_t n, uint16_t* to, cudaStream_t stream) {
  if (n == 0) return;
  narrow_kernel<<<grid_for(n), kThreads, 0, stream>>>(from, n, to);
  check_launch("narrow_kernel");
}

void widen_f16(const uint16_t* from, int64_t n, float* to, cudaStream_t stream) {
  if (n == 0) return;
  widen_f16_kernel<<<grid_for(n), kThreads, 0, stream>>>(from, n, to);
  check_launch("widen_f16_kernel");
}

void narrow_f16(const float* from, int64_t n, uint16_t* to, int* overflowed, cudaStream_t stream) {
  if (n == 0) return;
  narrow_f16_kernel<<<grid_for(n), kThreads, 0, stream>>>(from, n, to, overflowed);
  check_launch("narrow_f16_kernel");
}

}  // namespace mhla::cuda
