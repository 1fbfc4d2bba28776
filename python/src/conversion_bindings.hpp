#pragma once
// bfloat16 <-> float32 and float16 <-> float32 conversions for mhla.torch's
// reduced-precision path.
//
// The operator computes in float32; mhla.torch widens bfloat16 and float16 q,
// k, v (and incoming gradients) to float32 and rounds the results back. Done
// here, in parallel loops into recycled memory with torch's rounding, instead
// of by torch 1.13's casts, the bfloat16 call went from 0.43x to 0.84x of the
// float32 speed (bench/reduced_precision_bench.py).
#include <pybind11/pybind11.h>

namespace mhla::python {

void bind_conversions(pybind11::module_& m);

}  // namespace mhla::python
