#pragma once
// The bfloat16 forward on tensor cores (bf16_tiles.cuh): block summaries and
// outputs, each one launch on the given stream; the mix between them is in
// bf16_mix_kernels.cuh. Products sum split bfloat16 operands in float, so the
// summaries and outputs come out near float32 accuracy and o is rounded once,
// as the CPU operator's float path does.
//
// Arrays as in thread_per_result_kernels.cuh: q, k [B, N, H, Dk] and v, o [B, N, H, Dv]
// in p.token_format (bfloat16, float16 or float32, passed as void pointers);
// summaries and mixed [B*H, M, Dk, Dv + 1] in float.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/thread_per_result_kernels.cuh"

namespace mhla::cuda {

// Whether the bfloat16 kernels (forward, mix and backward) can take the
// problem: a whole sequence, and the grid limits (B*H slices, the tiles of
// Dk, Dv, M and the summaries' width).
bool bf16_kernels_fit(const KernelProblem& p);

// summaries[bh, b] = phi(K_b)^T [V_b | 1], written in full.
void bf16_summaries(const KernelProblem& p, const void* k, const void* v, float* summaries,
                    cudaStream_t stream);

// o_t = y_t / (den_t + eps) or scale y_t, y_t = phi(q_t)^T mixed[block of t][:, :Dv] and
// den_t = phi(q_t) . z (token-level causal: plus W[i, i] sum_{j in i, j <= t}
// (phi(q_t) . phi(k_j)) [v_j | 1]), written for every token; sets *non_finite when an
// output or denominator is not finite.
void bf16_outputs(const KernelProblem& p, const void* q, const void* k, const void* v,
                  const float* w, const float* mixed, void* o, int* non_finite,
                  cudaStream_t stream);

}  // namespace mhla::cuda
