#include "cuda/status_kernels.cuh"

#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"
#include "cuda/launch.cuh"

namespace mhla::cuda {
namespace {

// One thread per entry of w's memory (weight_entries): refused entries the
// operator uses mark the status (every Toeplitz entry is used).
template <typename T>
__global__ void check_weights_kernel(KernelProblem p, const T* w, int64_t entries,
                                     DeviceStatus* status) {
  MHLA_GRID_STRIDE(e, entries) {
    bool read = true;
    if (!p.toeplitz) {
      const int64_t b = e % p.w_stride, i = e / p.w_stride % p.w_stride;
      read = i < p.mixing_blocks && b < p.mixing_blocks && uses(p, i, b);
    }
    const T value = w[e];
    if (read && (!isfinite(value) || (p.normalize && value < T(0))))
      atomicMin(&status->first_bad_weight, static_cast<unsigned long long>(e));
  }
}

// After check_weights_kernel, in stream order: the refused entry's value.
template <typename T>
__global__ void record_bad_weight_kernel(const T* w, DeviceStatus* status) {
  if (status->first_bad_weight != ~0ull)
    status->bad_weight_value = double(w[status->first_bad_weight]);
}

// A 16-bit token is not finite where its exponent bits are all set.
__device__ inline bool finite(uint16_t bits, TokenFormat format) {
  const uint16_t exponent = format == TokenFormat::float16 ? 0x7c00u : 0x7f80u;
  return (bits & exponent) != exponent;
}
__device__ inline bool finite(float x, TokenFormat) { return isfinite(x); }
__device__ inline bool finite(double x, TokenFormat) { return isfinite(x); }

template <typename T>
__global__ void check_inputs_kernel(CheckedInputs<T> in, DeviceStatus* status) {
  if (status->non_finite == 0) return;  // the common case: nothing to explain
  for (int a = 0; a < in.count; ++a) {
    MHLA_GRID_STRIDE(i, in.x[a].n) {
      if (!finite(in.x[a].data[i], in.format)) status->inputs_finite = 0;
    }
  }
}

template <typename T>
void launch_check_inputs(const CheckedInputs<T>& in, DeviceStatus* status, cudaStream_t stream) {
  int64_t largest = 0;
  for (int a = 0; a < in.count; ++a) largest = in.x[a].n > largest ? in.x[a].n : largest;
  check_inputs_kernel<<<grid_for(largest), kThreads, 0, stream>>>(in, status);
  check_launch("check_inputs_kernel");
}

template <typename T>
void launch_check_weights(const KernelProblem& p, const T* w, DeviceStatus* status,
                          cudaStream_t stream) {
  if (w == nullptr) return;
  const int64_t entries = weight_entries(p);
  check_weights_kernel<<<grid_for(entries), kThreads, 0, stream>>>(p, w, entries, status);
  check_launch("check_weights_kernel");
  record_bad_weight_kernel<<<1, 1, 0, stream>>>(w, status);
  check_launch("record_bad_weight_kernel");
}

__global__ void reset_status_kernel(DeviceStatus* status) {
  *status = DeviceStatus{~0ull, 0.0, 0, 1};
}

}  // namespace

void reset_status(DeviceStatus* status, cudaStream_t stream) {
  reset_status_kernel<<<1, 1, 0, stream>>>(status);
  check_launch("reset_status_kernel");
}

void check_weights(const KernelProblem& p, const float* w, DeviceStatus* status,
                   cudaStream_t stream) {
  launch_check_weights(p, w, status, stream);
}
void check_weights(const KernelProblem& p, const double* w, DeviceStatus* status,
                   cudaStream_t stream) {
  launch_check_weights(p, w, status, stream);
}
void check_inputs_finite(const CheckedInputs<uint16_t>& inputs, DeviceStatus* status,
                         cudaStream_t stream) {
  launch_check_inputs(inputs, status, stream);
}
void check_inputs_finite(const CheckedInputs<float>& inputs, DeviceStatus* status,
                         cudaStream_t stream) {
  launch_check_inputs(inputs, status, stream);
}
void check_inputs_finite(const CheckedInputs<double>& inputs, DeviceStatus* status,
                         cudaStream_t stream) {
  launch_check_inputs(inputs, status, stream);
}

}  // namespace mhla::cuda
