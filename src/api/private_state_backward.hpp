#pragma once
// backward() for callers inside this project, told whose saved arrays it
// gets. Arrays from outside are held to their fingerprints
// (core/saved_state_check.hpp), as the public backward() does; arrays that no
// one else can reach skip that check: a ForwardState's (api/forward_state.cpp,
// whose record of the call stands in for it) and those the torch autograd
// function and custom ops keep as tensors in their context (torch's version
// counters refuse a backward after q, k, v or w changed in place; a torch op's
// results must be tensors, so it cannot hold a ForwardState). Everything else
// is backward()'s, checks included. Not part of the installed API.
#include "mhla/operator.hpp"

namespace mhla::detail {

enum class SavedArrays { from_outside, private_to_caller };

template <typename T>
void backward(SavedArrays saved, const Options& options, TensorView<const T> q,
              TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
              TensorView<const T> o, TensorView<const T> grad_o, TensorView<T> grad_q,
              TensorView<T> grad_k, TensorView<T> grad_v, TensorView<T> grad_w,
              TensorView<const T> saved_summaries, TensorView<const T> saved_mixed);

void backward(SavedArrays saved, const Options& options, TensorView<const bfloat16> q,
              TensorView<const bfloat16> k, TensorView<const bfloat16> v, TensorView<const float> w,
              TensorView<const bfloat16> o, TensorView<const bfloat16> grad_o,
              TensorView<bfloat16> grad_q, TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v,
              TensorView<float> grad_w, TensorView<const float> saved_summaries,
              TensorView<const float> saved_mixed);

void backward(SavedArrays saved, const Options& options, TensorView<const float16> q,
              TensorView<const float16> k, TensorView<const float16> v, TensorView<const float> w,
              TensorView<const float16> o, TensorView<const float16> grad_o,
              TensorView<float16> grad_q, TensorView<float16> grad_k, TensorView<float16> grad_v,
              TensorView<float> grad_w, TensorView<const float> saved_summaries,
              TensorView<const float> saved_mixed);

}  // namespace mhla::detail
