#pragma once
// The tiled softmax-attention kernel behind mhla::softmax_attention_forward /
// backward (FlashAttention's online softmax on CPU). Arguments are validated
// by the API layer; q, k [B, N, H, Dk], v, o [B, N, H, Dv], lse [B, H, N].
#include "core/validate.hpp"

namespace mhla::cpu {

// Softmax attention, the baseline: q, k [B, N, H, Dk], v, o [B, N, H, Dv],
// lse [B, H, N] (the log-sum-exp of each query's scores, for backward).
struct SoftmaxProblem {
  detail::AttentionDims d;
  double scale;
  bool causal;
};

template <typename T>
void softmax_forward(const SoftmaxProblem& x, const T* q, const T* k, const T* v, T* o, T* lse);

template <typename T>
void softmax_backward(const SoftmaxProblem& x, const T* q, const T* k, const T* v, const T* o,
                      const T* lse, const T* grad_o, T* grad_q, T* grad_k, T* grad_v);

}  // namespace mhla::cpu
