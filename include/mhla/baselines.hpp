#pragma once
// Baselines with MHLA's tensor layout, built with the same care, so that every
// speed or quality comparison in the project is like for like.
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

// Vanilla linear attention: one global summary sum_j phi(k_j) v_j^T read by
// every query (MHLA with a single block and w = [[1]]); causal mode uses the
// running prefix. q, k [B, N, H, Dk]; v, o [B, N, H, Dv].
template <typename T>
void linear_attention_forward(const LinearAttentionOptions& options, TensorView<const T> q,
                              TensorView<const T> k, TensorView<const T> v, TensorView<T> o);
template <typename T>
void linear_attention_backward(const LinearAttentionOptions& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                               TensorView<const T> grad_o, TensorView<T> grad_q,
                               TensorView<T> grad_k, TensorView<T> grad_v);

struct SoftmaxOptions {
  bool causal = false;
  std::optional<double> scale;  // default Dk^-1/2
};

// softmax(q k^T * scale) v, computed in tiles with an online softmax: memory is
// O(N D), never N x N. lse [B, H, N] receives each row's log-sum-exp of the
// scaled logits, which the backward pass needs.
template <typename T>
void softmax_attention_forward(const SoftmaxOptions& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<T> o,
                               TensorView<T> lse);
template <typename T>
void softmax_attention_backward(const SoftmaxOptions& options, TensorView<const T> q,
                                TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                                TensorView<const T> lse, TensorView<const T> grad_o,
                                TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v);

double linear_attention_flops_forward(int64_t batch, int64_t tokens, int64_t heads, int64_t dk,
                                      int64_t dv);
double softmax_flops_forward(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                             bool causal);

}  // namespace mhla
