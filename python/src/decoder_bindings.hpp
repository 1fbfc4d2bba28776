#pragma once
// mhla.DecoderOptions and mhla.Decoder: streaming (token-by-token) causal
// decoding from Python, with prefill, step, reset, snapshots and pickling.
#include <pybind11/pybind11.h>

namespace mhla::python {

void bind_decoder(pybind11::module_& m);

}  // namespace mhla::python
