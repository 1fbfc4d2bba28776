#pragma once
// One validated problem as the CUDA kernels read it: plain sizes and flags
// and device pointers for the block geometry, the same struct on the host
// (kernel_problem_of.hpp builds it; the tiling emulation of the
// bfloat16-state kernels reads it there) and on the device.
#include <cstdint>

#include "mhla/modes.hpp"

// A function that both the kernels and their host emulation call.
#if defined(__CUDACC__)
#define MHLA_HD __host__ __device__
#else
#define MHLA_HD
#endif

namespace mhla::cuda {

// All sizes in elements; the block arrays are device pointers in the
// backend, host pointers in the emulation.
struct KernelProblem {
  int64_t batch = 0, tokens = 0, heads = 0, dk = 0, dv = 0;
  int64_t blocks = 0;               // M of this call
  int64_t largest_block = 0;        // tokens in the largest block
  const int64_t* block_tokens = nullptr;  // [N]: the tokens of block 0, then block 1, ...
  const int64_t* block_start = nullptr;   // [M + 1]: block b is block_tokens[start[b] .. start[b+1])
  const int64_t* token_block = nullptr;   // [N]: the block of each token
  // W: rows first_block .. first_block + M - 1 against mixing_blocks
  // columns; dense rows w_stride apart, or Toeplitz (w[min(i - b, L)]).
  int64_t first_block = 0, mixing_blocks = 0, w_stride = 0;
  bool per_head = false, toeplitz = false, lower_triangular = false;
  // Token-level causal masking (1D; the bfloat16 kernels only): the mix reads
  // the blocks before a row's own, and the own block enters token by token.
  bool causal = false;
  int64_t toeplitz_length = 0;
  FeatureMap phi = FeatureMap::elu1;
  bool normalize = true;
  double eps = 1e-6, scale = 1.0;
};

}  // namespace mhla::cuda
