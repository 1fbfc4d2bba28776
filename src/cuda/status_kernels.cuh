#pragma once
// The checks of a call that runs without waiting (DeviceChecks::deferred):
// its status stays on the device until the backend reads it back behind an
// event, so they are kernels, launched on the call's stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// One call's checks as the kernels leave them.
struct DeviceStatus {
  // The first entry of w (its flat index) that the mode reads and refuses
  // (not finite or, normalized, negative); ~0 when none. Its value beside it.
  unsigned long long first_bad_weight;
  double bad_weight_value;
  int non_finite;  // a kernel found a result that is not finite
  int inputs_finite;  // cleared where non_finite was raised on a non-finite input
};

// The entries of w's memory: [copies, rows, columns] dense, [copies, L + 1] Toeplitz.
inline int64_t weight_entries(const KernelProblem& p) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1;
  return copies * (p.toeplitz ? p.toeplitz_length + 1 : p.w_stride * p.w_stride);
}

// A clean status (no refused weight, no non-finite result), written on the
// stream so that a call captured into a graph resets it on every replay.
void reset_status(DeviceStatus* status, cudaStream_t stream);

// Sets status->first_bad_weight and bad_weight_value to w's first refused
// entry (dense or Toeplitz, shared or per head, the entries the masking reads).
void check_weights(const KernelProblem& p, const float* w, DeviceStatus* status,
                   cudaStream_t stream);
void check_weights(const KernelProblem& p, const double* w, DeviceStatus* status,
                   cudaStream_t stream);

// The inputs of a call whose entries could explain a non-finite result.
constexpr int kMaxCheckedInputs = 4;
template <typename T>
struct CheckedInputs {
  struct Array {
    const T* data;
    int64_t n;
  };
  Array x[kMaxCheckedInputs];
  int count = 0;
  TokenFormat format = TokenFormat::bfloat16;  // how 16-bit entries are read
};

// Where status->non_finite is raised: clears status->inputs_finite when an
// entry of one of the inputs is not finite, since a non-finite input
// propagates without an error. Where it is not raised the kernel returns at
// once.
void check_inputs_finite(const CheckedInputs<uint16_t>& inputs, DeviceStatus* status,
                         cudaStream_t stream);  // 16-bit tokens of inputs.format
void check_inputs_finite(const CheckedInputs<float>& inputs, DeviceStatus* status,
                         cudaStream_t stream);
void check_inputs_finite(const CheckedInputs<double>& inputs, DeviceStatus* status,
                         cudaStream_t stream);

}  // namespace mhla::cuda
