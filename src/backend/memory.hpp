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

// The element types the API's element-wise passes touch.
enum class Element { float32, float64, bfloat16, float16 };
template <typename T>
constexpr Element element_of();
template <>
constexpr Element element_of<float>() {
  return Element::float32;
}
template <>
constexpr Element element_of<double>() {
  return Element::float64;
}
template <>
constexpr Element element_of<bfloat16>() {
  return Element::bfloat16;
}
template <>
constexpr Element element_of<float16>() {
  return Element::float16;
}

constexpr size_t element_bytes(Element type) {
  return type == Element::float64 ? 8 : type == Element::float32 ? 4 : 2;
}

// One element-wise pass over `n` elements of the device's memory: `to` = 0
// (`from` unused); `to` = `from` in to's type (the same type copied,
// bfloat16 and float16 widened to float exactly, float rounded to them to
// nearest, ties to even); or `to` += `from` (float or double, one type).
struct Elementwise {
  enum class Kind { zero, copy, add };
  Kind kind;
  Element from_type, to_type;
  const void* from;
  void* to;
  int64_t n;
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
  // Returns false where a rounding to float16 took a finite value past its
  // range (65504; the caller then names the first), true otherwise.
  // Throws std::logic_error on a pass not described above.
  virtual bool elementwise(const Elementwise& pass) const = 0;
  // Copies `bytes` of the device's memory to host memory (for the checks and
  // reports that read values: core/host_copy.hpp).
  virtual void to_host(const void* from, size_t bytes, void* to) const = 0;
};

// Typed scratch: `count` elements of T.
template <typename T>
T* scratch(const Memory& memory, Scratch slot, size_t count) {
  return static_cast<T*>(memory.scratch(slot, count * sizeof(T)));
}

// The element-wise passes, typed.
template <typename T>
void zero(const Memory& memory, T* to, int64_t n) {
  memory.elementwise({Elementwise::Kind::zero, element_of<T>(), element_of<T>(), nullptr, to, n});
}
template <typename T>
void add(const Memory& memory, const T* from, int64_t n, T* to) {
  memory.elementwise({Elementwise::Kind::add, element_of<T>(), element_of<T>(), from, to, n});
}
// Copies, widens or narrows; false as Memory::elementwise says.
template <typename From, typename To>
bool convert(const Memory& memory, const From* from, int64_t n, To* to) {
  return memory.elementwise(
      {Elementwise::Kind::copy, element_of<From>(), element_of<To>(), from, to, n});
}

}  // namespace mhla::backend
