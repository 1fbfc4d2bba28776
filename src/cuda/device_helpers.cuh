#pragma once
// What every kernel shares on the device: phi, the feature map, and where a
// token's row sits in a token tensor.
#include <cstdint>

#include "cuda/reference_kernels.cuh"
#include "mhla/modes.hpp"

namespace mhla::cuda {

template <typename T>
__device__ inline T feature(FeatureMap phi, T x) {
  if (phi == FeatureMap::relu) return x > T(0) ? x : T(0);
  if (phi == FeatureMap::elu1) return x > T(0) ? x + T(1) : exp(x);
  return x;
}

// The flat row of token t of batch entry bb, head h, in a token tensor.
__device__ inline int64_t token_row(const KernelProblem& p, int64_t bb, int64_t t, int64_t h) {
  return (bb * p.tokens + t) * p.heads + h;
}

}  // namespace mhla::cuda
