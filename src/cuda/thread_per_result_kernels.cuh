#pragma once
// The CUDA backend's kernels in their plainest form: one thread per result
// element, each summing its own terms in a fixed order: slow, obviously
// correct and deterministic, the naive check beside the tensor-core kernels
// ("reference" names only the float64 references of src/reference/). Every phase of the
// operator and its backward is one launch on the given stream.
//
// Arrays: q, k [B, N, H, Dk], v, o [B, N, H, Dv] (token tensors); summaries
// and mixed summaries [B*H, M, Dk, Dv + 1] (the last column holds z).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// 1. summaries[bh, b] = phi(K_b)^T [V_b | 1]
template <typename T>
void summaries(const KernelProblem& p, const T* k, const T* v, T* summaries, cudaStream_t stream);
// 2. mixed[bh, i] = sum_b W[first_block + i, b] summaries[bh, b] (b <= i when lower triangular)
template <typename T>
void mix(const KernelProblem& p, const T* w, const T* summaries, T* mixed, cudaStream_t stream);
// 3. o_t = y_t[:Dv] / (y_t[Dv] + eps) or scale y_t[:Dv], y_t = phi(q_t)^T mixed[block of t].
// Sets *non_finite when an output or denominator is not finite.
template <typename T>
void outputs(const KernelProblem& p, const T* q, const T* mixed, T* o, int* non_finite,
             cudaStream_t stream);

// Backward of 3: grad_q and grad_mixed (written). token_terms: scratch of
// 2 B N H elements (per token: 1 / (den + eps) and the denominator's gradient).
template <typename T>
void output_gradients(const KernelProblem& p, const T* q, const T* mixed, const T* grad_o,
                      T* grad_q, T* grad_mixed, T* token_terms, int* non_finite,
                      cudaStream_t stream);
// Backward of 2: grad_summaries written, grad_w added to.
template <typename T>
void mix_backward(const KernelProblem& p, const T* w, const T* summaries, const T* grad_mixed,
                  T* grad_summaries, T* grad_w, int* non_finite, cudaStream_t stream);
// Backward of 1: grad_k and grad_v (written).
template <typename T>
void key_value_gradients(const KernelProblem& p, const T* k, const T* v, const T* grad_summaries,
                         T* grad_k, T* grad_v, int* non_finite, cudaStream_t stream);

}  // namespace mhla::cuda
