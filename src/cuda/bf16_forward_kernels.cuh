#pragma once
// The bfloat16 forward on tensor cores (WMMA, sm_80 and later): block
// summaries, their mix and the outputs, each one launch on the given stream.
//
// The products take bfloat16 operands and sum in float32. An operand that is
// not already bfloat16 (phi(k), phi(q), W and the float summaries) is split
// into two bfloat16 halves, hi = bf16(x) and lo = bf16(x - hi), and the
// products add hi*y + lo*y (and, for outputs, hi*lo terms): about 16 bits of
// mantissa, so the summaries and outputs come out near float32 accuracy and
// o is rounded once, as the CPU operator's float path does.
//
// Arrays as in reference_kernels.cuh: q, k [B, N, H, Dk] and v, o [B, N, H, Dv]
// in bfloat16; summaries and mixed [B*H, M, Dk, Dv + 1] in float.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/reference_kernels.cuh"

namespace mhla::cuda {

// Whether the launches below can take the problem: a whole sequence, and the
// grid limits (B*H slices, the tiles of Dk, Dv and the summaries' width).
bool bf16_kernels_fit(const KernelProblem& p);

// summaries[bh, b] = phi(K_b)^T [V_b | 1], written in full.
void bf16_summaries(const KernelProblem& p, const uint16_t* k, const uint16_t* v, float* summaries,
                    cudaStream_t stream);

// mixed[bh, i] = sum_b W[i, b] summaries[bh, b] over the blocks the masking
// lets row i read (the problem is a whole sequence: first_block 0), written in full.
void bf16_mix(const KernelProblem& p, const float* w, const float* summaries, float* mixed,
              cudaStream_t stream);

// o_t = y_t / (phi(q_t) . z + eps) or scale y_t, y_t = phi(q_t)^T mixed[block of t][:, :Dv],
// written for every token; sets *non_finite when an output or denominator is not finite.
void bf16_outputs(const KernelProblem& p, const uint16_t* q, const float* mixed, uint16_t* o,
                  int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
