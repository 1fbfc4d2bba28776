#pragma once
// MHLA's three phases and their backward (mhla/phases.hpp), and the shard
// arithmetic of context parallelism (mhla/shards.hpp), for the Python
// torch.distributed layer (mhla.distributed), which does the communication
// with torch's collectives and the arithmetic with these.
#include <pybind11/pybind11.h>

namespace mhla::python {

void bind_phases(pybind11::module_& m);

}  // namespace mhla::python
