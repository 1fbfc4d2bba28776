#pragma once
// How calls on device tensors (CUDA) run: on which stream, and when their
// value checks are read back. A setting of the calling thread, as a current
// stream is: it holds for every later call of that thread with device
// tensors, and CPU calls ignore it.
namespace mhla {

enum class DeviceChecks {
  // Every call reads its checks back before it returns: w's values before
  // any kernel runs, the kernels' non-finite flag after them (a
  // device-to-host copy that waits for the call's kernels). Failures throw
  // the exact errors of the CPU operator, naming the entry and its causes.
  sync,
  // Nothing waits. w's values are checked on the device and the flags are
  // copied to pinned memory behind an event; the first later call of the
  // thread that finds a failed check done (or check_device_results()) throws
  // it. A w error keeps the operator's exact words (its entry and value are
  // kept on the device); a non-finite result is reported without naming its
  // entry, since the tensors may have changed since. Calls captured into a
  // CUDA graph are not checked (their flags are never read).
  deferred,
};

struct DeviceExecution {
  void* stream = nullptr;  // the cudaStream_t the calls run on; nullptr: the legacy default stream
  DeviceChecks checks = DeviceChecks::sync;
};

// This thread's setting for its later calls, and the setting now.
void set_device_execution(const DeviceExecution& execution);
DeviceExecution device_execution();

// Waits for this thread's deferred checks and throws the first that failed
// (an mhla::Error); returns when every one passed.
void check_device_results();

// Whether bfloat16 calls on CUDA tensors (and float16 ones, where
// cuda_float16_kernels() is true too) may run on the bfloat16-state kernels
// (docs/cuda.md): set by MHLA_CUDA_BF16_STATE=1 in the environment, off by
// default until they have passed their tests on a GPU; always false in a
// build without the CUDA backend. Their backward recomputes its state from
// q, k, v and w and reads no saved arrays, so a caller that would keep the
// float summaries between the passes for that backward (mhla.torch) keeps
// nothing where this is true.
bool cuda_bf16_state_kernels();

// Whether float16 calls on CUDA tensors run on the tensor-core kernels
// (docs/cuda.md): set by MHLA_CUDA_FLOAT16=1, off by default until they have
// passed their tests on a GPU; otherwise float16 calls compute in float32 on
// widened copies with the float kernels. Always false without the CUDA backend.
bool cuda_float16_kernels();

// Whether float32 calls of forward() and backward() on CUDA tensors run on
// the tensor-core kernels (docs/cuda.md): every operand split into two
// bfloat16 halves, 16 of float32's 24 significant bits (about 1e-5 relative
// where the float kernels are exact to float32), sums in float, token-level
// causal masking included. Set by MHLA_CUDA_FLOAT32_TENSOR_CORES=1, off by
// default until they have run on a GPU; otherwise float32 calls run one
// thread per result. Always false without the CUDA backend.
bool cuda_float32_tensor_cores();

}  // namespace mhla
