#include "conversion_bindings.hpp"

#include <bit>
#include <cstdint>
#include <string>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"

namespace py = pybind11;

namespace mhla::python {
namespace {

// bfloat16 is the upper half of a float32, so widening is exact.
inline float widen(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// Round to nearest, ties to even (torch's rounding); NaN stays NaN.
inline uint16_t narrow(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0u) : uint16_t(rounded);
}

ImportedTensor imported(py::handle x, DType want) {
  ImportedTensor t(x, "x", true);
  if (t.dtype() != want)
    throw py::type_error(std::string("x has dtype ") + dtype_name(t.dtype()) + "; expected " +
                         dtype_name(want));
  return t;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

Buffer bfloat16_to_float32(py::handle x) {
  const ImportedTensor in = imported(x, DType::bfloat16);
  Buffer out(DType::float32, in.shape());
  const uint16_t* src = in.view<uint16_t>().data;
  float* dst = out.view<float>().data;
  const int64_t n = numel(in.shape());
  py::gil_scoped_release release;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = widen(src[i]);
  return out;
}

Buffer float32_to_bfloat16(py::handle x) {
  const ImportedTensor in = imported(x, DType::float32);
  Buffer out(DType::bfloat16, in.shape());
  const float* src = in.view<float>().data;
  uint16_t* dst = out.view<uint16_t>().data;
  const int64_t n = numel(in.shape());
  py::gil_scoped_release release;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = narrow(src[i]);
  return out;
}

}  // namespace

void bind_conversions(py::module_& m) {
  m.def("bfloat16_to_float32", &bfloat16_to_float32, py::arg("x"),
        "A C-order bfloat16 CPU tensor widened to float32 (exact), as a new buffer.");
  m.def("float32_to_bfloat16", &float32_to_bfloat16, py::arg("x"),
        "A C-order float32 CPU tensor rounded to bfloat16 (nearest, ties to even; NaN stays "
        "NaN), as a new buffer.");
}

}  // namespace mhla::python
