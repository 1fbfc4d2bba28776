#pragma once
// The bfloat16 backward on tensor cores (bf16_tiles.cuh), around the mix's
// backward (bf16_mix_kernels.cuh): q, k, v, grad_o and gradients in
// p.token_format (void pointers, as for the forward), float summaries, mixed summaries, their gradients and per-token terms.
// Arrays as in thread_per_result_kernels.cuh. The problem is a whole sequence
// (bf16_kernels_fit).
//
// With y_t = phi(q_t)^T mixed_i[:, :Dv] and den_t = phi(q_t) . z_i for token t
// of block i (token-level causal: plus W[i, i] sum_{j in i, j <= t} s_tj [v_j | 1],
// s_tj = phi(q_t) . phi(k_j)), and o_t = y_t / (den_t + eps) (or scale y_t):
//   inv_t = 1 / (den_t + eps) (or scale),  dden_t = -inv_t^2 g_t . y_t,
//   dy_t = [inv_t g_t | dden_t],  grad phi(q_t) = mixed_i dy_t (+ causal:
//   W[i, i] sum_{j <= t} (dy_t . [v_j | 1]) phi(k_j)),
//   grad_mixed_i = sum_t phi(q_t) dy_t^T,
// and from grad_summaries [dS_b | dz_b]:
//   grad phi(k_j) = dS_b v_j + dz_b,   grad_v_j = dS_b^T phi(k_j)
//   (+ causal: W[i, i] sum_{t >= j} (dy_t . [v_j | 1]) phi(q_t) and
//   W[i, i] sum_{t >= j} s_tj inv_t g_t), and W[i, i] gains
//   sum_t sum_{j <= t} s_tj (dy_t . [v_j | 1]).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/thread_per_result_kernels.cuh"

namespace mhla::cuda {

// grad_q (written), terms [B N H, 2] = (inv_t, dden_t) per token row, and,
// with token-level causal masking, diagonal [B*H, M, chunks of 64 tokens]:
// each chunk's part of W[i, i]'s gradient. Sets *non_finite when a gradient
// or a term is not finite.
void bf16_query_gradients(const KernelProblem& p, const void* q, const void* k, const void* v,
                          const void* grad_o, const float* w, const float* mixed, void* grad_q,
                          float* terms, float* diagonal, int* non_finite, cudaStream_t stream);

// The floats of bf16_query_gradients' diagonal.
int64_t bf16_diagonal_terms(const KernelProblem& p);

// grad_mixed (written) from the terms of bf16_query_gradients.
void bf16_mixed_gradients(const KernelProblem& p, const void* q, const void* grad_o,
                          const float* terms, float* grad_mixed, cudaStream_t stream);

// grad_k and grad_v (written) from the summaries' gradient (and, causal, the
// terms). Sets *non_finite when a gradient is not finite.
void bf16_key_value_gradients(const KernelProblem& p, const void* q, const void* k, const void* v,
                              const void* grad_o, const float* w, const float* terms,
                              const float* grad_summaries, void* grad_k, void* grad_v,
                              int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
