#pragma once
// An element of the operator's [B, N, H, D] tensors as the number it holds,
// in the type the kernels compute with: float and double as they are,
// bfloat16 and float16 widened (exactly) to float.
#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"

namespace mhla::detail {

template <typename T>
inline T value_of(T x) {
  return x;
}
inline float value_of(bfloat16 x) { return to_float(x); }
inline float value_of(float16 x) { return to_float(x); }

}  // namespace mhla::detail
