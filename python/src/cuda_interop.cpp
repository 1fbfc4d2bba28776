#include "cuda_interop.hpp"

#include <pybind11/pybind11.h>

#include <string>

#if MHLA_WITH_CUDA
#include <cuda_runtime.h>

#include "mhla/binding.hpp"
#include "mhla/error.hpp"
#endif

namespace py = pybind11;

namespace mhla::python::cuda {
namespace {
thread_local int64_t current_call_stream = kLegacyDefaultStream;
}  // namespace

int64_t call_stream() { return current_call_stream; }

CallStream::CallStream(py::handle stream)
    : previous_(current_call_stream), previous_execution_(device_execution()) {
  if (!stream.is_none() && !py::isinstance<py::int_>(stream))
    throw py::type_error(
        "stream must be a cudaStream_t as an int (torch: "
        "torch.cuda.current_stream().cuda_stream) or None, not " +
        std::string(py::str(py::type::handle_of(stream).attr("__name__"))));
  const int64_t handle = stream.is_none() ? 0 : stream.cast<int64_t>();
  if (handle < 0)
    throw py::value_error("stream must be a cudaStream_t as an int (0 or more) or None, not " +
                          std::to_string(handle));
  current_call_stream = handle == 0 ? kLegacyDefaultStream : handle;
  set_device_execution({reinterpret_cast<void*>(handle), previous_execution_.checks});
}

CallStream::~CallStream() {
  current_call_stream = previous_;
  set_device_execution(previous_execution_);
}

#if MHLA_WITH_CUDA

bool backend_built() { return true; }

void check_usable(const char* name, int id) {
  const std::string where = std::string(name) + " is on cuda:" + std::to_string(id);
  if (!binding::cuda_device_present())
    throw py::value_error(where + ", but no CUDA device is visible to this process (" +
                          binding::cuda_absence_reason() + ")");
  int current = 0;
  binding::check_cuda(cudaGetDevice(&current), "cudaGetDevice");
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
  binding::check_cuda(status, "cudaMalloc (a result)");
  // cudaFree waits for the device, so memory a consumer still reads on
  // another stream is never handed out again early.
  return std::shared_ptr<void>(memory, [](void* p) { cudaFree(p); });
}

void wait_for_device() { binding::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void order_after(int64_t producer_stream, int64_t consumer_stream) {
  if (consumer_stream == -1 || consumer_stream == producer_stream) return;
  // DLPack's codes 1 and 2 are the runtime's handles of the default streams.
  cudaEvent_t done = nullptr;
  binding::check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t recorded =
      cudaEventRecord(done, reinterpret_cast<cudaStream_t>(producer_stream));
  const cudaError_t waited =
      recorded == cudaSuccess
          ? cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(consumer_stream), done, 0)
          : recorded;
  cudaEventDestroy(done);  // released once the wait is satisfied
  binding::check_cuda(waited, "ordering the consumer's stream after mhla's (cudaStreamWaitEvent)");
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

void order_after(int64_t, int64_t) { no_backend("a result is on a CUDA device"); }

#endif

}  // namespace mhla::python::cuda
