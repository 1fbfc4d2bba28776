#pragma once
// Scratch arrays kept by each calling thread between operator calls.
//
// The summary arrays are O(B H M Dk Dv); allocating them afresh on every call
// (zeroing plus first-touch page faults) cost about a third of mhla_bench's
// forward. Buffers only grow; their contents are unspecified, so every
// kernel fully overwrites what it reads back.
#include <cstddef>
#include <memory>

#include "backend/backend.hpp"

namespace mhla::cpu {

using Scratch = backend::Scratch;

template <typename T>
T* scratch(Scratch slot, size_t elements);

// Frees the calling thread's scratch arrays.
void release_scratch_buffers();

}  // namespace mhla::cpu
