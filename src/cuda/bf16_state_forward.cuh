#pragma once
// The bfloat16-state forward (tiling in bf16_state_plan.hpp; the mix in
// bf16_state_mix.cuh): the summaries, the mix and the read-out with the state
// in bfloat16 rows, 16-byte
// asynchronous copies and one bfloat16 tensor-core product a step. It is the
// forward designed for the byte budget (docs/cuda.md#the-byte-budget), off
// by default (options.cuda.bf16_state turns it on) until it has passed its
// tests on a GPU; the tiling emulation checks it in every build.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// The state between the forward's kernels (sizes: state::state_sizes).
struct Bf16State {
  uint16_t* summaries;  // S [B*H, M, Dk, Dv], bfloat16
  float* normalisers;   // z [B*H, M, Dk]
  uint16_t* mixed;      // S~, as S
  float* mixed_normalisers;  // z~, as z
};

// Whether the kernels take the problem and its tensors (16-byte aligned).
bool bf16_state_forward_fits(const KernelProblem& p, const void* q, const void* k, const void* v,
                             const void* o);

// The forward's kernels one by one (bf16_state_forward runs them in order;
// the mix between them is bf16_state_mix.cuh's), for the backward's
// recomputation and for timing each: the summaries S, z of k and v; the
// read-out of o from q and the mixed state S~, z~, with token-level causal
// masking also from k, v and W's diagonal (sets *non_finite when an output
// or denominator is not finite).
void bf16_state_summaries(const KernelProblem& p, const uint16_t* k, const uint16_t* v,
                          const Bf16State& state, cudaStream_t stream);
void bf16_state_read_out(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                         const uint16_t* v, const float* w, const Bf16State& state, uint16_t* o,
                         int* non_finite, cudaStream_t stream);

// o = the operator's forward of bfloat16 q, k, v [B, N, H, Dk or Dv] with
// float W, written for every token, through `state`; sets *non_finite when
// an output or denominator is not finite. Four launches on `stream`.
void bf16_state_forward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                        const uint16_t* v, const float* w, uint16_t* o, const Bf16State& state,
                        int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
