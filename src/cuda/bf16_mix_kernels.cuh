#pragma once
// The mix of the summaries and its backward on tensor cores (bf16_tiles.cuh),
// for the bfloat16 operator: float summaries [B*H, M, Dk, Dv + 1], float W,
// products of split bfloat16 operands summed in float. The problem is a whole
// sequence (first_block 0, bf16_kernels_fit).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/thread_per_result_kernels.cuh"

namespace mhla::cuda {

// mixed[bh, i] = sum_b W[i, b] summaries[bh, b] over the blocks the masking
// lets row i read, written in full.
void bf16_mix(const KernelProblem& p, const float* w, const float* summaries, float* mixed,
              cudaStream_t stream);

// The floats of scratch bf16_mix_backward needs for the problem.
int64_t bf16_mix_backward_scratch(const KernelProblem& p);

// Backward of the mix: grad_summaries[bh, b] = sum_i W[i, b] grad_mixed[bh, i]
// (written) and, unless grad_w is null, grad_w[i, b] += the sum over the
// slices of W's copy of grad_mixed[bh, i] . summaries[bh, b] (dense W), or
// its sums along the diagonals (Toeplitz W); with token-level causal masking
// W[i, i] gains the in-block terms of bf16_query_gradients' diagonal instead.
// The weight gradient is summed in a fixed order (partial sums per split of
// the slices, then their sum), so repeated calls give identical results. Sets
// *non_finite when an entry of grad_w is not finite.
void bf16_mix_backward(const KernelProblem& p, const float* w, const float* summaries,
                       const float* grad_mixed, const float* diagonal, float* grad_summaries,
                       float* grad_w, float* scratch, int* non_finite, cudaStream_t stream);

// grad_w[copy, d] += Toeplitz entry d's part of the dense weight gradient
// kept in dense[copy * splits] ([M, M] each): its entries where
// min(i - b, L) = d, i >= b, added in a fixed order.
void bf16_toeplitz_weight_gradient(const KernelProblem& p, int64_t splits, const float* dense,
                                   float* grad_w, int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
