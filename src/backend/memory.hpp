#pragma once
// The memory half of the backend seam (backend.hpp): what the API asks of a
// device's memory around the kernels, namely per-thread scratch arrays,
// element-wise work, and copies to the host for the checks that read values.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"

namespace mhla::backend {

// Arrays a device keeps for the calling thread between calls (contents
// unspecified; they only grow), that the API and any backend's kernels may
// ask for: the summaries and mixed summaries a call does not keep, and the
// summaries' gradient; the token_grad slots, O(B N H D), where the phase
// functions' backward computes its gradients before adding them to the
// caller's buffers; the widened slots, float copies of the 16-bit
// operator's arguments where it computes in float. A backend keeps its
// kernels' other arrays to itself (the CPU's: cpu/workspace.hpp).
enum class Scratch {
  summaries,
  mixed,
  summaries_grad,
  token_grad_q,
  token_grad_k,
  token_grad_v,
  widened_q,
  widened_k,
  widened_v,
  widened_o,
  widened_grad_o,
  range_flag,  // a device's flag of float16 narrowing out of range
  count
};

class Memory {
 public:
  virtual ~Memory() = default;

  // At least `bytes` of the calling thread's array `slot`, aligned for any element type.
  virtual void* scratch(Scratch slot, size_t bytes) const = 0;
  virtual void release_scratch() const = 0;

  // `bytes` of the device's memory for the caller to keep (a ForwardState's
  // arrays), aligned for any element type, freed with the last owner.
  virtual std::shared_ptr<void> allocate(size_t bytes) const = 0;
  // Element-wise work on the device's memory: to[i] += from[i]; to[i] =
  // from[i]; to[i] = 0; bfloat16 and float16 widened to float (exact), and
  // float rounded to them (to nearest, ties to even).
  virtual void add(const float* from, int64_t n, float* to) const = 0;
  virtual void add(const double* from, int64_t n, double* to) const = 0;
  virtual void copy(const float* from, int64_t n, float* to) const = 0;
  virtual void copy(const double* from, int64_t n, double* to) const = 0;
  virtual void zero(float* to, int64_t n) const = 0;
  virtual void zero(double* to, int64_t n) const = 0;
  virtual void widen(const bfloat16* from, int64_t n, float* to) const = 0;
  virtual void narrow(const float* from, int64_t n, bfloat16* to) const = 0;
  virtual void widen(const float16* from, int64_t n, float* to) const = 0;
  // Returns whether every finite value stayed finite (float16's range ends
  // at 65504); the caller then names the first that did not.
  virtual bool narrow(const float* from, int64_t n, float16* to) const = 0;
  // Copies `bytes` of the device's memory to host memory (for the checks and
  // reports that read values: core/host_copy.hpp).
  virtual void to_host(const void* from, size_t bytes, void* to) const = 0;
};

// Typed scratch: `count` elements of T.
template <typename T>
T* scratch(const Memory& memory, Scratch slot, size_t count) {
  return static_cast<T*>(memory.scratch(slot, count * sizeof(T)));
}

}  // namespace mhla::backend
