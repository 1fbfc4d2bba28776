#pragma once
// The sizes and flags of one validated MHLA (or linear) call: plain values
// only, so that the same struct is the CPU kernels' problem
// (core/validate.hpp: detail::Problem) and, unchanged, the CUDA kernels'
// (cuda/kernel_problem.hpp: KernelProblem, on the host and on the device).
#include <cstdint>

#include "mhla/modes.hpp"

// A function that both the CUDA kernels and host code call.
#if defined(__CUDACC__)
#define MHLA_HD __host__ __device__
#else
#define MHLA_HD
#endif

namespace mhla::detail {

// Sizes of one attention call; q, k [B, N, H, Dk], v [B, N, H, Dv].
struct AttentionDims {
  int64_t batch = 0, tokens = 0, heads = 0, dk = 0, dv = 0;
};

struct ProblemParams : AttentionDims {
  int64_t blocks = 1;  // this call's blocks
  // The part of W this call reads: rows first_block .. first_block + blocks - 1
  // (its own blocks) against mixing_blocks summaries (the columns). An ordinary
  // call reads all of W (first_block 0, mixing_blocks = blocks); a piece of a
  // longer sequence starts later, and a packed sequence reads the top-left
  // corner of a larger dense w, whose rows are w_stride apart.
  int64_t first_block = 0;
  int64_t mixing_blocks = 1;
  int64_t w_stride = 1;
  bool per_head_mixing = false;
  // Toeplitz mixing: w holds L + 1 entries per copy, W[i, b] = w[min(i - b, L)].
  bool toeplitz = false;
  int64_t toeplitz_length = 0;  // L
  bool causal = false;          // token-level causal (1D)
  bool block_causal = false;    // causal across blocks, full inside a block
  // Whether only W[i, b] with b <= i is read.
  MHLA_HD bool lower_triangular() const { return causal || block_causal; }
  FeatureMap phi = FeatureMap::identity;
  bool normalize = true;
  double eps = 1e-6;
  double scale = 1.0;  // unnormalized mode
  // The call's CUDA kernel families (mhla::CudaKernels).
  bool cuda_bf16_state = false;
  bool cuda_float16_tensor_cores = false;
  bool cuda_float32_tensor_cores = false;
};

}  // namespace mhla::detail
