#pragma once
// What every kernel shares on the device: phi, the feature map, and its derivative, W's entries
// as the mix reads them, and where a token's row sits in a token tensor. The
// host compiles them too, for the tiling emulation.
#include <cmath>
#include <cstdint>

#include "cuda/kernel_problem.hpp"
#include "mhla/modes.hpp"

namespace mhla::cuda {

template <typename T>
MHLA_HD inline T feature(FeatureMap phi, T x) {
  if (phi == FeatureMap::relu) return x > T(0) ? x : T(0);
#if defined(__CUDA_ARCH__)
  if (phi == FeatureMap::elu1) return x > T(0) ? x + T(1) : exp(x);
#else
  if (phi == FeatureMap::elu1) return x > T(0) ? x + T(1) : std::exp(x);
#endif
  return x;
}

template <typename T>
MHLA_HD inline T feature_derivative(FeatureMap phi, T x) {
  if (phi == FeatureMap::relu) return x > T(0) ? T(1) : T(0);
  if (phi == FeatureMap::elu1) return x > T(0) ? T(1) : feature(phi, x);
  return T(1);
}

// W[row, col] of head h's copy (row, col absolute block indices); every
// entry 1 for w == nullptr, the parameter-free sum of linear attention.
template <typename T>
MHLA_HD inline T weight(const KernelProblem& p, const T* w, int64_t h, int64_t row,
                           int64_t col) {
  if (w == nullptr) return T(1);
  const int64_t copy = p.per_head_mixing ? h : 0;
  if (p.toeplitz) {
    const int64_t d = row - col < p.toeplitz_length ? row - col : p.toeplitz_length;
    return w[copy * (p.toeplitz_length + 1) + d];
  }
  return w[(copy * p.w_stride + row) * p.w_stride + col];
}

// Whether the mix reads W[row, col]. Triangular rows stop at their own
// block; token-level causal rows before it (their own block enters in block).
MHLA_HD inline bool reads(const KernelProblem& p, int64_t row, int64_t col) {
  if (p.causal) return col < row;
  return !(p.lower_triangular() || p.toeplitz) || col <= row;
}

// Whether the operator uses W[row, col]: what the mix reads, and with
// token-level causal masking the diagonal too.
MHLA_HD inline bool uses(const KernelProblem& p, int64_t row, int64_t col) {
  return reads(p, row, col) || (p.causal && row == col);
}

// Toeplitz entry d's gradient from one copy's dense weight gradient g [M, M]:
// the sum of g[i, b] where min(i - b, L) = d, i >= b, in a fixed order.
template <typename T>
MHLA_HD inline T toeplitz_entry_gradient(const KernelProblem& p, const T* g, int64_t d) {
  const int64_t m = p.blocks, length = p.toeplitz_length;
  T sum = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (d < length) {
      if (i >= d) sum += g[i * m + i - d];
    } else {
      for (int64_t b = 0; b + length <= i; ++b) sum += g[i * m + b];
    }
  }
  return sum;
}

// The flat row of token t of batch entry bb, head h, in a token tensor.
MHLA_HD inline int64_t token_row(const KernelProblem& p, int64_t bb, int64_t t, int64_t h) {
  return (bb * p.tokens + t) * p.heads + h;
}

}  // namespace mhla::cuda
