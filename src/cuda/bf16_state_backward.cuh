#pragma once
// The bfloat16-state backward (tiling in bf16_state_plan.hpp): the forward's
// state recomputed (bf16_state_summaries), then the query side (grad_q and
// the mixed state's gradient, grad S~ in bfloat16 rows and grad z~ in float),
// the mix's transpose (grad S, grad z) with the weight gradient
// (bf16_state_mix.cuh), and the key and value side (grad_k, grad_v). Off by
// default with the forward (options.cuda.bf16_state) until it has passed its
// tests on a GPU; the tiling emulation checks it in every build.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bf16_state_forward.cuh"
#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// The dynamic shared memory one CTA of the backward's wider token kernel
// takes for this problem (the query side's or the key and value side's).
int64_t bf16_state_backward_shared_bytes(const KernelProblem& p);

// Whether the kernels take the problem and its tensors (16-byte aligned) on
// the current device: its opt-in shared memory a CTA must hold
// bf16_state_backward_shared_bytes (227 KB on sm_90 and 163 KB on sm_80
// do; the about 99 KB of sm_86, sm_89 and sm_120 do not hold the causal
// kernels at Dv > 64), else the caller runs the split-operand kernels.
bool bf16_state_backward_fits(const KernelProblem& p, const void* q, const void* k, const void* v,
                              const void* grad_o, const void* grad_q, const void* grad_k,
                              const void* grad_v);

// The floats of scratch the backward needs: the weight gradient's
// (bf16_state_weight_scratch), and with token-level causal masking the
// tokens' terms and W's diagonal part after it.
int64_t bf16_state_backward_scratch(const KernelProblem& p);

// The backward's two token kernels (bf16_state_backward runs them with the
// recomputed state, the mix's transpose and the weight gradient between
// them), for timing each: the query side (grad_q, and grad S~, grad z~ into
// `grads`) and the key and value side (grad_k, grad_v from grad S, grad z).
// Each sets *non_finite when a gradient it writes is not finite. With
// token-level causal masking both add their own block's terms: the query
// side writes each token's 1 / (den + eps) and grad den to `terms` [B N H,
// 2], which the key and value side reads, and that side writes the own
// blocks' part of W's diagonal gradient to `diagonal` [B H, M]; both are
// null otherwise, and q, w and grad_o (key and value side) or k, v and w
// (query side) are read causal only.
void bf16_state_query_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const float* w, const uint16_t* grad_o,
                           const Bf16State& state, const Bf16State& grads, uint16_t* grad_q,
                           float* terms, int* non_finite, cudaStream_t stream);
void bf16_state_key_value_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                               const uint16_t* v, const float* w, const uint16_t* grad_o,
                               const Bf16State& grads, const float* terms, uint16_t* grad_k,
                               uint16_t* grad_v, float* diagonal, int* non_finite,
                               cudaStream_t stream);

// grad_q, grad_k, grad_v (written for every token) and grad_w (added to,
// unless null) of the operator at bfloat16 q, k, v [B, N, H, Dk or Dv], float
// W and grad_o, through `state` (recomputed) and `grads` (their gradients,
// laid out as the state); sets *non_finite when a gradient is not finite.
void bf16_state_backward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                         const uint16_t* v, const float* w, const uint16_t* grad_o,
                         uint16_t* grad_q, uint16_t* grad_k, uint16_t* grad_v, float* grad_w,
                         const Bf16State& state, const Bf16State& grads, float* scratch,
                         int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
