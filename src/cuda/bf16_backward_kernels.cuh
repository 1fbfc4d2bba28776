#pragma once
// The bfloat16 backward on tensor cores (bf16_tiles.cuh), around the mix's
// backward (bf16_mix_kernels.cuh): bfloat16 q, k, v, grad_o and gradients,
// float summaries, mixed summaries, their gradients and per-token terms.
// Arrays as in reference_kernels.cuh. The problem is a whole sequence, not
// token-causal (bf16_kernels_fit).
//
// With y_t = phi(q_t)^T mixed_i[:, :Dv] and den_t = phi(q_t) . z_i for token t
// of block i, and o_t = y_t / (den_t + eps) (or scale y_t):
//   u_t = mixed_i[:, :Dv] grad_o_t,   inv_t = 1 / (den_t + eps) (or scale),
//   dden_t = -inv_t^2 phi(q_t) . u_t (0 unnormalised),
//   grad phi(q_t) = inv_t u_t + dden_t z_i,
//   grad_mixed_i = sum_t phi(q_t) [inv_t grad_o_t | dden_t],
// and from grad_summaries [dS_b | dz_b]:
//   grad phi(k_j) = dS_b v_j + dz_b,   grad_v_j = dS_b^T phi(k_j).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/reference_kernels.cuh"

namespace mhla::cuda {

// grad_q (written) and terms [B N H, 2] = (inv_t, dden_t) per token row.
// Sets *non_finite when a gradient or a term is not finite.
void bf16_query_gradients(const KernelProblem& p, const uint16_t* q, const uint16_t* grad_o,
                          const float* mixed, uint16_t* grad_q, float* terms, int* non_finite,
                          cudaStream_t stream);

// grad_mixed (written) from the terms of bf16_query_gradients.
void bf16_mixed_gradients(const KernelProblem& p, const uint16_t* q, const uint16_t* grad_o,
                          const float* terms, float* grad_mixed, cudaStream_t stream);

// grad_k and grad_v (written) from the summaries' gradient. Sets *non_finite
// when a gradient is not finite.
void bf16_key_value_gradients(const KernelProblem& p, const uint16_t* k, const uint16_t* v,
                              const float* grad_summaries, uint16_t* grad_k, uint16_t* grad_v,
                              int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
