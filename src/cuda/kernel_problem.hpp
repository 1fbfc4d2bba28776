#pragma once
// One validated problem as the CUDA kernels read it: the call's sizes and
// flags as the CPU kernels read them (core/problem_params.hpp) and the block
// geometry as flat arrays, the same struct on the host (kernel_problem_of.hpp
// builds it; the tiling emulation of the bfloat16-state kernels reads it
// there) and on the device.
#include <cstdint>

#include "core/problem_params.hpp"

namespace mhla::cuda {

// The formats of the tokens (q, k, v, o and their gradients) that the
// tensor-core kernels read and write.
enum class TokenFormat : int { bfloat16, float16, float32 };

// All sizes in elements; the block arrays are device pointers in the
// backend, host pointers in the emulation. Token-level causal masking (1D)
// runs on the bfloat16 kernels only: the mix reads the blocks before a row's
// own, and the own block enters token by token.
struct KernelProblem : detail::ProblemParams {
  int64_t largest_block = 0;              // tokens in the largest block
  const int64_t* block_tokens = nullptr;  // [N]: the tokens of block 0, then block 1, ...
  const int64_t* block_start = nullptr;   // [M + 1]: block b is block_tokens[start[b] .. start[b+1])
  const int64_t* token_block = nullptr;   // [N]: the block of each token
  TokenFormat token_format = TokenFormat::bfloat16;  // of the tensor-core kernels' tokens
};

}  // namespace mhla::cuda
