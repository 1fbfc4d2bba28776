#pragma once
// The mix of the bfloat16 state (tiling in bf16_state_plan.hpp) and its
// backward: S~ = W S and z~ = W z for the forward; grad S = W^T grad S~,
// grad z = W^T grad z~ and the weight gradient for the backward. Rows of the
// state [Dk, Dv] in bfloat16, normalisers [Dk] in float, W in float.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// to = W from (transposed: W^T from) over the rows of one slice's [M, Dk Dv]
// bfloat16 state, and to_z = W from_z (W^T from_z) over its [M, Dk] float
// normalisers, as the masking lets each row of W be read. Two launches.
void bf16_state_mix(const KernelProblem& p, const float* w, bool transposed, const uint16_t* from,
                    const float* from_z, uint16_t* to, float* to_z, cudaStream_t stream);

// The floats of scratch bf16_state_weight_gradient needs for the problem.
int64_t bf16_state_weight_scratch(const KernelProblem& p);

// grad_w[i, b] += the sum over the slices of W's copy of grad_mixed[bh, i] .
// s[bh, b] + grad_mixed_z[bh, i] . z[bh, b] where the mix reads W[i, b], and
// with token-level causal masking W[i, i]'s own-block part diagonal[bh, i]
// (dense W), or its sums along the diagonals (Toeplitz W); partial sums per
// split of the slices, then their sum in order, so repeated calls give the
// same bits. Sets *non_finite when an entry of grad_w is not finite.
void bf16_state_weight_gradient(const KernelProblem& p, const uint16_t* grad_mixed,
                                const float* grad_mixed_z, const uint16_t* s, const float* z,
                                const float* diagonal, float* grad_w, float* scratch,
                                int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
