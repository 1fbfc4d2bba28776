#pragma once
// What the bindings need of CUDA to take and return device tensors through
// DLPack: is a tensor's device usable, memory for results there, and the
// stream handshake. A call runs on the stream its caller names (CallStream;
// the legacy default stream unless named), so each input's producer is asked
// (DLPack's `stream` argument) to order its pending work before that stream,
// and a result's consumer stream is made to wait for the work the call left
// on it. Without the CUDA backend (a build without the CUDA toolkit) each of
// these refuses by name; no CUDA runtime is linked then.
#include <pybind11/pytypes.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mhla/device_execution.hpp"

namespace mhla::python::cuda {

// DLPack's stream argument that names the legacy default stream.
inline constexpr int64_t kLegacyDefaultStream = 1;

// Whether this build of the extension has the CUDA backend.
bool backend_built();

// Raises ValueError, naming `name` ("q"), unless device `id` is the calling
// thread's current CUDA device of a build with the CUDA backend.
void check_usable(const char* name, int id);

// `bytes` of memory on the current device, freed with its last owner.
std::shared_ptr<void> allocate(size_t bytes);

// Waits for all work on the device: for a producer that could not be asked
// to order its work (it had no __dlpack_device__ to say it was on CUDA).
void wait_for_device();

// Streams as DLPack codes them: 1 the legacy default stream, 2 the per-thread
// default stream, -1 none, otherwise a cudaStream_t (the CUDA runtime's own
// handles for the two defaults are 1 and 2 as well).

// The stream of the calling thread's binding call now (1 outside calls).
int64_t call_stream();

// For the duration of one binding call: its CUDA work runs on `stream`, a
// cudaStream_t as an int (torch: torch.cuda.current_stream().cuda_stream, 0
// for the legacy default stream), or None for the legacy default stream.
// Calls on CPU tensors ignore it, as the library does.
class CallStream {
 public:
  explicit CallStream(pybind11::handle stream);
  ~CallStream();
  CallStream(const CallStream&) = delete;
  CallStream& operator=(const CallStream&) = delete;

 private:
  int64_t previous_;
  DeviceExecution previous_execution_;
};

// Makes the consumer's stream wait for the work issued so far on the
// producer's (both as DLPack codes them).
void order_after(int64_t producer_stream, int64_t consumer_stream);

}  // namespace mhla::python::cuda
