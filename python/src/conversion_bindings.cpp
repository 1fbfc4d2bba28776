#include "conversion_bindings.hpp"

#include <cstdint>
#include <string>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"

namespace py = pybind11;

namespace mhla::python {
namespace {

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
                                    [](uint16_t h) { return to_float(float16{h}); });
}

Buffer float32_to_float16(py::handle x) {
  return converted<float, uint16_t>(x, DType::float32, DType::float16,
                                    [](float f) { return to_float16(f).bits; });
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
