#pragma once
// The checks and error reports read values: w's signs, a state's record of w,
// a result's first non-finite entry. On the CPU they read the caller's
// memory; a tensor on another device is copied to the host first. Only the
// entry points that run on such a device take this path, and only for these
// reads: small arrays (w, grad_w) on every call, token tensors only when a
// report is being written.
#include <cstddef>
#include <type_traits>
#include <vector>

#include "mhla/tensor.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla::detail {

// Copies `bytes` of `device` memory at `from` to host memory at `to`
// (defined with the backends: api/backends.cpp).
void copy_to_host(Device device, const void* from, size_t bytes, void* to);

// A view of the same tensor in host memory: the tensor itself on the CPU,
// otherwise a copy this object owns.
template <typename T>
class HostCopy {
 public:
  explicit HostCopy(const TensorView<T>& t) : view_(t) {
    if (t.device == Device::cpu || t.data == nullptr) return;
    copy_.resize(size_t(checked_product(t.shape, "a device tensor copied to the host")));
    copy_to_host(t.device, t.data, copy_.size() * sizeof(T), copy_.data());
    view_ = {copy_.data(), t.shape, Device::cpu};
  }
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  const TensorView<T>& view() const { return view_; }
  T* data() const { return view_.data; }

 private:
  std::vector<std::remove_const_t<T>> copy_;
  TensorView<T> view_;
};

}  // namespace mhla::detail
