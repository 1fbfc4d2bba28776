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

}  // namespace mhla
