#pragma once
// The element types the bindings accept, and their DLPack descriptions.
#include <dlpack/dlpack.h>

#include <cstddef>

namespace mhla::python {

enum class DType { float32, float64 };

inline const char* dtype_name(DType dtype) {
  return dtype == DType::float32 ? "float32" : "float64";
}
inline size_t dtype_size(DType dtype) { return dtype == DType::float32 ? 4 : 8; }
inline DLDataType to_dlpack(DType dtype) {
  return DLDataType{static_cast<uint8_t>(kDLFloat), static_cast<uint8_t>(8 * dtype_size(dtype)), 1};
}

template <typename T>
constexpr DType dtype_of() {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  return sizeof(T) == 4 ? DType::float32 : DType::float64;
}

// Runs fn.template operator()<T>() with T the C++ type of `dtype`.
template <typename Fn>
decltype(auto) dispatch(DType dtype, Fn&& fn) {
  return dtype == DType::float32 ? fn.template operator()<float>()
                                 : fn.template operator()<double>();
}

}  // namespace mhla::python
