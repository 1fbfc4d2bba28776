// The backends of this build, by device: where an entry point finds the
// kernels for its tensors.
#include "backend/backend.hpp"

#include "mhla/operator.hpp"

namespace mhla {

// Every backend of this build frees the calling thread's arrays.
void release_scratch() { backend::cpu_backend().release_scratch(); }

namespace backend {

const Backend& backend_for(const char* fn, const char* name, Device device) {
  // Refuses, by name, a device this build has no backend for.
  detail::check_device(fn, name, device);
  return cpu_backend();
}

}  // namespace backend
}  // namespace mhla
