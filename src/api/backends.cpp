// The backends of this build, by device: where an entry point finds the
// kernels for its tensors.
#include "backend/backend.hpp"

#include <cstring>
#include <string>

#include "core/host_copy.hpp"
#include "core/validate.hpp"
#include "mhla/device_execution.hpp"
#include "mhla/operator.hpp"

namespace mhla {
namespace {

thread_local DeviceExecution this_thread_execution;

}  // namespace

void set_device_execution(const DeviceExecution& execution) { this_thread_execution = execution; }

DeviceExecution device_execution() { return this_thread_execution; }

void check_device_results() {
#if MHLA_WITH_CUDA
  if (backend::cuda_device_present()) backend::cuda_backend().raise_deferred(true);
#endif
}

// Every backend of this build frees the calling thread's arrays.
void release_scratch() {
  backend::cpu_backend().memory().release_scratch();
#if MHLA_WITH_CUDA
  if (backend::cuda_device_present()) backend::cuda_backend().memory().release_scratch();
#endif
}

namespace detail {

bool has_backend(Device device) {
#if MHLA_WITH_CUDA
  if (device == Device::cuda) return true;
#endif
  return device == Device::cpu;
}

void copy_to_host(Device device, const void* from, size_t bytes, void* to) {
  if (device == Device::cpu) {
    std::memcpy(to, from, bytes);
    return;
  }
  backend::backend_for("mhla (copying a device tensor to the host)", "the tensor", device)
      .memory()
      .to_host(from, bytes, to);
}

}  // namespace detail

namespace backend {

const Backend& backend_for(const char* fn, const char* name, Device device) {
  if (device == Device::cpu) return cpu_backend();
#if MHLA_WITH_CUDA
  if (device == Device::cuda) {
    if (!cuda_device_present())
      detail::fail(fn,
                   std::string(name) +
                       " is on the cuda device, but no CUDA device is visible to this process (" +
                       cuda_absence_reason() + ")");
    return cuda_backend();
  }
#endif
  // Refuses, by name, a device this build has no backend for.
  detail::check_device(fn, name, device);
  return cpu_backend();
}

}  // namespace backend
}  // namespace mhla
