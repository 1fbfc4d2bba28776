#include "conversion_bindings.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/bfloat16.hpp"

namespace py = pybind11;

namespace mhla::python {
namespace {

// IEEE float16 (1 sign, 5 exponent, 10 fraction bits), by hand: compilers'
// _Float16 is missing on some (clang 14 on x86). Widening is exact.
inline float widen_half(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu,
                 fraction = h & 0x3ffu;
  // All three readings, then a choice, so that the loop vectorises (see
  // python/CMakeLists.txt): the exponent rebiased from 15 to 127; infinity or
  // NaN; zero or subnormal, in units of 2^-24 (exact in float, and never a
  // float subnormal, which flush-to-zero modes would lose).
  const uint32_t normal = ((exponent + 112) << 23) | (fraction << 13);
  const uint32_t special = 0x7f800000u | (fraction << 13);
  const uint32_t small = std::bit_cast<uint32_t>(float(fraction) * 0x1p-24f);
  return std::bit_cast<float>(sign | (exponent == 0 ? small : exponent == 31 ? special : normal));
}

// Round to nearest, ties to even, as torch does: from 65520 up to infinity;
// NaN stays NaN.
inline uint16_t narrow_half(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {
    // Normal: rebias the exponent, then round away the 13 extra fraction bits
    // (a carry into the exponent is the right result).
    const uint32_t rebiased = magnitude - 0x38000000u;
    return uint16_t(sign | ((rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13));
  }
  // Subnormal or zero: the value in units of 2^-24 (exact), rounded to an
  // integer; 1024 units is the smallest normal, whose encoding is 0x0400.
  const float units = std::bit_cast<float>(magnitude) * 0x1p24f;
  return uint16_t(sign | uint32_t(std::nearbyint(units)));
}

// x (of dtype `from`, read as From) converted element by element into a new
// buffer of dtype `to`.
template <typename From, typename To, typename Convert>
Buffer converted(py::handle x, DType from, DType to, Convert convert) {
  const ImportedTensor in(x, "x", true);
  if (in.dtype() != from)
    throw py::type_error(std::string("x has dtype ") + dtype_name(in.dtype()) + "; expected " +
                         dtype_name(from));
  Buffer out(to, in.shape());
  const From* src = in.view<From>().data;
  To* dst = out.view<To>().data;
  int64_t n = 1;
  for (int64_t e : in.shape()) n *= e;
  py::gil_scoped_release release;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = convert(src[i]);
  return out;
}

Buffer bfloat16_to_float32(py::handle x) {
  return converted<uint16_t, float>(x, DType::bfloat16, DType::float32,
                                    [](uint16_t b) { return to_float(bfloat16{b}); });
}

Buffer float32_to_bfloat16(py::handle x) {
  return converted<float, uint16_t>(x, DType::float32, DType::bfloat16,
                                    [](float f) { return to_bfloat16(f).bits; });
}

Buffer float16_to_float32(py::handle x) {
  return converted<uint16_t, float>(x, DType::float16, DType::float32,
                                    [](uint16_t h) { return widen_half(h); });
}

Buffer float32_to_float16(py::handle x) {
  return converted<float, uint16_t>(x, DType::float32, DType::float16,
                                    [](float f) { return narrow_half(f); });
}

}  // namespace

void bind_conversions(py::module_& m) {
  m.def("bfloat16_to_float32", &bfloat16_to_float32, py::arg("x"),
        "A C-order bfloat16 CPU tensor widened to float32 (exact), as a new buffer.");
  m.def("float32_to_bfloat16", &float32_to_bfloat16, py::arg("x"),
        "A C-order float32 CPU tensor rounded to bfloat16 (nearest, ties to even; NaN stays "
        "NaN), as a new buffer.");
  m.def("float16_to_float32", &float16_to_float32, py::arg("x"),
        "A C-order float16 CPU tensor widened to float32 (exact), as a new buffer.");
  m.def("float32_to_float16", &float32_to_float16, py::arg("x"),
        "A C-order float32 CPU tensor rounded to float16 (nearest, ties to even, beyond the "
        "largest float16 to infinity), as a new buffer.");
}

}  // namespace mhla::python
