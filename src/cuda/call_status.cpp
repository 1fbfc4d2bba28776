#include "cuda/call_status.hpp"

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "mhla/device_execution.hpp"

namespace mhla::cuda {

// One queued call's status on the device, its copy in pinned host memory and
// the event after which the copy is complete.
class StatusSlot {
 public:
  StatusSlot() {
    check(cudaMalloc(&device_, sizeof(DeviceStatus)), "cudaMalloc");
    check(cudaMallocHost(&host_, sizeof(DeviceStatus)), "cudaMallocHost");
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  StatusSlot(const StatusSlot&) = delete;
  StatusSlot& operator=(const StatusSlot&) = delete;
  ~StatusSlot() {
    cudaEventDestroy(done_);
    cudaFreeHost(host_);
    cudaFree(device_);
  }
  DeviceStatus* device() const { return device_; }
  DeviceStatus* host() const { return host_; }
  cudaEvent_t done() const { return done_; }

 private:
  DeviceStatus* device_ = nullptr;
  DeviceStatus* host_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

namespace {

struct Queued {
  std::unique_ptr<StatusSlot> slot;
  const char* fn;
  detail::Problem problem;
  int64_t weight_entries;
};

// The report of a queued call's status: a refused weight in the operator's
// own words (check_mixing_values on a w that holds only that entry), else a
// non-finite result that no non-finite input explains.
void report(const Queued& q, const DeviceStatus& s) {
  if (s.first_bad_weight != ~0ull) {
    std::vector<double> w(size_t(q.weight_entries), 0.0);
    w[size_t(s.first_bad_weight)] = s.bad_weight_value;
    detail::check_mixing_values(q.fn, q.problem, w.data());
  }
  if (s.non_finite != 0 && s.inputs_finite != 0)
    detail::fail(q.fn,
                 "a result of an earlier call on CUDA is not finite although every input is "
                 "finite (checked on the device and read back after the call, when its tensors "
                 "may have changed; DeviceChecks::sync names the entry and its causes)");
}

// This thread's queued calls, oldest first, and the slots free for reuse.
class DeferredChecks {
 public:
  std::unique_ptr<StatusSlot> acquire() {
    if (free_.empty()) return std::make_unique<StatusSlot>();
    std::unique_ptr<StatusSlot> slot = std::move(free_.back());
    free_.pop_back();
    return slot;
  }
  void push(Queued q) { queued_.push_back(std::move(q)); }
  void recycle(std::unique_ptr<StatusSlot> slot) { free_.push_back(std::move(slot)); }
  void raise(bool wait) {
    while (!queued_.empty()) {
      Queued& q = queued_.front();
      if (wait) {
        check(cudaEventSynchronize(q.slot->done()), "cudaEventSynchronize");
      } else {
        const cudaError_t status = cudaEventQuery(q.slot->done());
        if (status == cudaErrorNotReady) return;  // later calls finish later
        check(status, "cudaEventQuery");
      }
      const DeviceStatus s = *q.slot->host();
      Queued done = std::move(q);
      queued_.pop_front();
      free_.push_back(std::move(done.slot));
      report(done, s);
    }
  }

 private:
  std::deque<Queued> queued_;
  std::vector<std::unique_ptr<StatusSlot>> free_;
};

thread_local DeferredChecks deferred_checks;

}  // namespace

cudaStream_t current_stream() { return static_cast<cudaStream_t>(device_execution().stream); }

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

void raise_deferred_checks(bool wait) {
  const cudaStream_t stream = current_stream();
  if (!wait && capturing(stream)) {
    if (device_execution().checks == DeviceChecks::sync)
      throw Error(
          "mhla (CUDA backend): this call is being captured into a CUDA graph, which cannot wait "
          "for its checks; set DeviceChecks::deferred (mhla::set_device_execution) before "
          "capturing");
    return;  // nothing may wait or query during a capture
  }
  deferred_checks.raise(wait);
}

CallStatus::CallStatus(const char* fn, const detail::Problem& problem, int64_t weight_entries,
                       DeviceStatus* scratch)
    : fn_(fn), problem_(problem), weight_entries_(weight_entries), stream_(current_stream()) {
  problem_.layout = nullptr;  // only the scalars outlive the call
  problem_.table = {};
  if (deferred() && !capturing(stream_)) slot_ = deferred_checks.acquire();
  status_ = slot_ ? slot_->device() : scratch;
  reset_status(status_, stream_);
}

// A call that ended before queueing its status (an exception) gives its slot back.
CallStatus::~CallStatus() {
  if (slot_) deferred_checks.recycle(std::move(slot_));
}

bool CallStatus::read_back() const {
  DeviceStatus host{};
  check(cudaMemcpyAsync(&host, status_, sizeof host, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (device to host)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return host.non_finite != 0;
}

void CallStatus::queue() {
  if (!slot_) return;  // captured: the status stays on the device, unread
  check(cudaMemcpyAsync(slot_->host(), status_, sizeof(DeviceStatus), cudaMemcpyDeviceToHost,
                        stream_),
        "cudaMemcpyAsync (status to pinned memory)");
  check(cudaEventRecord(slot_->done(), stream_), "cudaEventRecord");
  deferred_checks.push({std::move(slot_), fn_, problem_, weight_entries_});
}

}  // namespace mhla::cuda
