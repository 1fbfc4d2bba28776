#pragma once
// Scratch arrays kept by each calling thread between operator calls.
//
// The summary arrays are O(B H M Dk Dv); allocating them afresh on every call
// (zeroing plus first-touch page faults) cost about a third of a forward pass
// at N = 16384. Buffers only grow; their contents are unspecified, so every
// kernel fully overwrites what it reads back.
#include <cstddef>
#include <memory>

namespace mhla::cpu {

// The token_grad slots are O(B N H D): the phase functions' backward computes
// its gradients there before adding them to the caller's buffers, and the
// bfloat16 backward the float gradients it rounds. The widened slots hold the
// float copies of the bfloat16 operator's inputs where it computes in float.
enum class Scratch {
  summaries,
  mixed,
  summaries_grad,
  diagonal_grad,
  token_grad_q,
  token_grad_k,
  token_grad_v,
  widened_q,
  widened_k,
  widened_v,
  widened_o,
  widened_grad_o,
  summary_pairs,  // the bfloat16 forward's summaries for the dense mix (uint16_t halves)
  count
};

template <typename T>
T* scratch(Scratch slot, size_t elements);

// Frees the calling thread's scratch arrays.
void release_scratch_buffers();

}  // namespace mhla::cpu
