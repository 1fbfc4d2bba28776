#pragma once
// The element types the bindings accept, and their DLPack descriptions.
#include <dlpack/dlpack.h>

#include <cstddef>
#include <stdexcept>

namespace mhla::python {

// The operator computes in float32 and float64, and takes bfloat16 and
// float16 q, k, v with float32 w (bindings.cpp); the other entry points
// compute in float32 and float64 only, and the conversion functions read and
// write the 16-bit types (conversion_bindings.hpp).
enum class DType { float32, float64, bfloat16, float16 };

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::float16:
      return "float16";
    default:
      return "bfloat16";
  }
}
inline size_t dtype_size(DType dtype) {
  return dtype == DType::float64 ? 8 : dtype == DType::float32 ? 4 : 2;
}
inline DLDataType to_dlpack(DType dtype) {
  const auto code = dtype == DType::bfloat16 ? kDLBfloat : kDLFloat;
  return DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(8 * dtype_size(dtype)), 1};
}

template <typename T>
constexpr DType dtype_of() {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  return sizeof(T) == 4 ? DType::float32 : DType::float64;
}

// Runs fn.template operator()<T>() with T the C++ type of `dtype`, a
// computing type (ImportedTensor admits the storage types only where asked to).
template <typename Fn>
decltype(auto) dispatch(DType dtype, Fn&& fn) {
  if (dtype == DType::bfloat16 || dtype == DType::float16)
    throw std::invalid_argument("mhla computes in float32 or float64");
  return dtype == DType::float32 ? fn.template operator()<float>()
                                 : fn.template operator()<double>();
}

}  // namespace mhla::python
