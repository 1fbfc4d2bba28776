#pragma once
// Slow, obviously-correct double-precision references for MHLA, written from
// the definition and used to test every fast path. Two independent forms:
//   block_*: per-block summaries S_b, z_b, their mix, then each token's output;
//   dense_*: the explicit N x N attention matrix A[t,s] (small N only).
// Same argument conventions as mhla::forward / mhla::backward; shapes are
// validated the same way.
#include <vector>

#include "mhla/baselines.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla::reference {

void block_forward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                   TensorView<const double> v, TensorView<const double> w, TensorView<double> o);
void block_backward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                    TensorView<const double> v, TensorView<const double> w,
                    TensorView<const double> grad_o, TensorView<double> grad_q,
                    TensorView<double> grad_k, TensorView<double> grad_v,
                    TensorView<double> grad_w);

void dense_forward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                   TensorView<const double> v, TensorView<const double> w, TensorView<double> o);
void dense_backward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                    TensorView<const double> v, TensorView<const double> w,
                    TensorView<const double> grad_o, TensorView<double> grad_q,
                    TensorView<double> grad_k, TensorView<double> grad_v,
                    TensorView<double> grad_w);

// The row-normalised (or scaled) MHLA attention matrix of batch b, head h:
// o_t = sum_s A[t,s] v_s. Row-major [N, N].
std::vector<double> mhla_attention_matrix(const Options& options, TensorView<const double> q,
                                          TensorView<const double> k, TensorView<const double> w,
                                          int64_t batch, int64_t head);

// softmax(q k^T * scale), row-major [N, N], for batch b, head h.
std::vector<double> softmax_attention_matrix(const SoftmaxOptions& options,
                                             TensorView<const double> q, TensorView<const double> k,
                                             int64_t batch, int64_t head);

// Dense softmax attention with its gradient, the reference for the tiled baseline.
void softmax_forward(const SoftmaxOptions& options, TensorView<const double> q,
                     TensorView<const double> k, TensorView<const double> v, TensorView<double> o);
void softmax_backward(const SoftmaxOptions& options, TensorView<const double> q,
                      TensorView<const double> k, TensorView<const double> v,
                      TensorView<const double> grad_o, TensorView<double> grad_q,
                      TensorView<double> grad_k, TensorView<double> grad_v);

}  // namespace mhla::reference
