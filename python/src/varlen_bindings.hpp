#pragma once
// varlen_forward / varlen_backward: packed variable-length batches (the
// cu_seqlens convention), each sequence its own 1D MHLA problem.
#include <pybind11/pybind11.h>

namespace mhla::python {

void bind_varlen(pybind11::module_& m);

}  // namespace mhla::python
