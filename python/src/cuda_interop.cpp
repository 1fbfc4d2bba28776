#include "cuda_interop.hpp"

#include <pybind11/pybind11.h>

#include <string>

#if MHLA_WITH_CUDA
#include "backend/backend.hpp"
#include "cuda/cuda_check.hpp"
#endif

namespace py = pybind11;

namespace mhla::python::cuda {

#if MHLA_WITH_CUDA

bool backend_built() { return true; }

void check_usable(const char* name, int id) {
  const std::string where = std::string(name) + " is on cuda:" + std::to_string(id);
  if (!backend::cuda_device_present())
    throw py::value_error(where + ", but no CUDA device is visible to this process (" +
                          backend::cuda_absence_reason() + ")");
  int current = 0;
  mhla::cuda::check(cudaGetDevice(&current), "cudaGetDevice");
  // The backend's scratch arrays belong to the thread's current device.
  if (id != current)
    throw py::value_error(
        where + " but the current CUDA device is cuda:" + std::to_string(current) +
        "; make it current first (torch: torch.cuda.set_device(" + std::to_string(id) + "))");
}

std::shared_ptr<void> allocate(size_t bytes) {
  void* memory = nullptr;
  const cudaError_t status = cudaMalloc(&memory, bytes > 0 ? bytes : 1);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it for the next call
    throw OutOfMemory("mhla: cudaMalloc of " + std::to_string(bytes) +
                      " bytes for a result failed: the device is out of memory");
  }
  mhla::cuda::check(status, "cudaMalloc (a result)");
  // cudaFree waits for the device, so memory a consumer still reads on
  // another stream is never handed out again early.
  return std::shared_ptr<void>(memory, [](void* p) { cudaFree(p); });
}

void wait_for_device() { mhla::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void order_after_backend(int64_t consumer_stream) {
  if (consumer_stream == -1 || consumer_stream == kLegacyDefaultStream) return;
  const cudaStream_t stream =
      consumer_stream == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(consumer_stream);
  cudaEvent_t done = nullptr;
  mhla::cuda::check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t recorded = cudaEventRecord(done, cudaStreamLegacy);
  const cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(stream, done, 0) : recorded;
  cudaEventDestroy(done);  // released once the wait is satisfied
  mhla::cuda::check(waited, "ordering the consumer's stream after mhla's (cudaStreamWaitEvent)");
}

#else

namespace {
[[noreturn]] void no_backend(const std::string& what) {
  throw py::value_error(what +
                        ", but this build of mhla has no CUDA backend (it was built without the "
                        "CUDA toolkit, see docs/cuda.md); move it to the CPU first, or call "
                        "mhla.torch, whose functions take CUDA tensors through PyTorch");
}
}  // namespace

bool backend_built() { return false; }

void check_usable(const char* name, int id) {
  no_backend(std::string(name) + " is on cuda:" + std::to_string(id));
}

std::shared_ptr<void> allocate(size_t) { no_backend("a result is due on a CUDA device"); }

void wait_for_device() { no_backend("a tensor is on a CUDA device"); }

void order_after_backend(int64_t) { no_backend("a result is on a CUDA device"); }

#endif

}  // namespace mhla::python::cuda
