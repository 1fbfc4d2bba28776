#pragma once
// What the bindings need of CUDA to take and return device tensors through
// DLPack: is a tensor's device usable, memory for results there, and the
// stream handshake. The library's CUDA backend runs on the legacy default
// stream, so a producer is asked (DLPack's `stream = 1`) to order its pending
// work before that stream, and a consumer's stream is made to wait for it.
// Without the CUDA backend (a build without the CUDA toolkit) each of these
// refuses by name; no CUDA runtime is linked then.
#include <cstddef>
#include <cstdint>
#include <memory>

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

// Makes the consumer's stream (DLPack's code: 1 legacy default, 2 per-thread
// default, -1 none, otherwise a cudaStream_t) wait for the work issued so
// far on the legacy default stream.
void order_after_backend(int64_t consumer_stream);

}  // namespace mhla::python::cuda
