#pragma once
// The checks of one CUDA call (mhla/device_execution.hpp): with
// DeviceChecks::sync its status is read back before the call returns; with
// DeviceChecks::deferred it is copied to pinned memory behind an event and
// queued on the calling thread, and a later call (or check_device_results)
// reads it once the event has passed and throws what failed. A call being
// captured into a CUDA graph keeps its status on the device, unread.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "core/validate.hpp"
#include "cuda/kernel_problem.hpp"
#include "cuda/status_kernels.cuh"

namespace mhla::cuda {

// The stream of this thread's calls (DeviceExecution::stream).
cudaStream_t current_stream();

// Whether `stream` is being captured into a graph.
bool capturing(cudaStream_t stream);

// Throws the first failed check of this thread's queued calls: of those
// whose event has passed (wait false), or after waiting for all.
void raise_deferred_checks(bool wait);

class StatusSlot;

class CallStatus {
 public:
  // Clears the status on the call's stream and, where the validation left
  // the checks to the device (Problem::checks_on_device), checks w there.
  // `scratch` serves a call whose status is never queued (sync, or captured).
  template <typename W>
  CallStatus(const char* fn, const detail::Problem& problem, const KernelProblem& kernels,
             const W* w, DeviceStatus* scratch)
      : CallStatus(fn, problem, weight_entries(kernels), scratch) {
    if (deferred()) check_weights(kernels, w, status_, stream_);
  }
  CallStatus(const CallStatus&) = delete;
  CallStatus& operator=(const CallStatus&) = delete;
  ~CallStatus();

  int* non_finite() const { return &status_->non_finite; }

  // After the call's kernels. sync: whether they raised the non-finite flag
  // (the caller reports it, naming the entry). deferred: queues the read and
  // returns false; a raised flag is reported later, unless an entry of one
  // of `inputs` is not finite, since a non-finite input propagates.
  template <typename T>
  bool raised(const CheckedInputs<T>& inputs) {
    if (!deferred()) return read_back();
    check_inputs_finite(inputs, status_, stream_);
    queue();
    return false;
  }

 private:
  CallStatus(const char* fn, const detail::Problem& problem, int64_t weight_entries,
             DeviceStatus* scratch);
  bool deferred() const { return problem_.checks_on_device; }
  bool read_back() const;
  void queue();

  const char* fn_;
  detail::Problem problem_;  // its scalars, for the report of a refused weight
  int64_t weight_entries_;
  cudaStream_t stream_;
  std::unique_ptr<StatusSlot> slot_;  // a deferred call's own status (null: scratch)
  DeviceStatus* status_;
};

}  // namespace mhla::cuda
