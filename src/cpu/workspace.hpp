#pragma once
// Scratch arrays kept by each calling thread between operator calls.
//
// The summary arrays are O(B H M Dk Dv); allocating them afresh on every call
// (zeroing plus first-touch page faults) cost about a third of mhla_bench's
// forward. Buffers only grow; their contents are unspecified, so every
// kernel fully overwrites what it reads back.
#include <cstddef>
#include <memory>

#include "backend/memory.hpp"

namespace mhla::cpu {

using Scratch = backend::Scratch;

// The CPU kernels' own arrays, beside the seam's slots: the causal in-block
// part of dW's diagonal, and the bfloat16 forward's summaries for the dense
// mix (uint16_t halves).
enum class KernelScratch { diagonal_grad, summary_pairs, count };

template <typename T>
T* scratch(Scratch slot, size_t elements);
template <typename T>
T* scratch(KernelScratch slot, size_t elements);

// Frees the calling thread's scratch arrays.
void release_scratch_buffers();

}  // namespace mhla::cpu
