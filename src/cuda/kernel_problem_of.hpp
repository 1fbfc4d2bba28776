#pragma once
// A validated problem as the CUDA kernels read it, built on the host: the
// block arrays of its layout (what the backend uploads once per layout) and
// the KernelProblem over them. The backend points it at device copies of the
// arrays; the tiling emulation of the bfloat16-state kernels at the host ones.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/validate.hpp"
#include "cuda/kernel_problem.hpp"

namespace mhla::cuda {

// A layout's blocks as three arrays laid end to end: block_tokens [N] (each
// block's tokens in order), block_start [M + 1], token_block [N].
struct BlockArrays {
  std::vector<int64_t> values;
  int64_t largest_block = 0;
};

inline BlockArrays block_arrays(const detail::BlockTableView& table, int64_t n) {
  const int64_t m = table.blocks;
  BlockArrays arrays;
  arrays.values.resize(size_t(2 * n + m + 1));
  int64_t* block_tokens = arrays.values.data();
  int64_t* block_start = block_tokens + n;
  int64_t* token_block = block_start + m + 1;
  int64_t next = 0;
  for (int64_t b = 0; b < m; ++b) {
    block_start[b] = next;
    table.for_each_run(b, [&](int64_t first, int64_t length) {
      for (int64_t t = first; t < first + length; ++t) {
        block_tokens[next++] = t;
        token_block[t] = b;
      }
    });
    arrays.largest_block = std::max(arrays.largest_block, next - block_start[b]);
  }
  block_start[m] = next;
  return arrays;
}

// The kernels' view of p, its block arrays at `arrays` (laid out as
// BlockArrays::values, on the device or the host): p's sizes and flags as
// they are, and where its blocks' tokens are.
inline KernelProblem kernel_problem(const detail::Problem& p, const int64_t* arrays,
                                    int64_t largest_block) {
  const int64_t n = p.tokens, m = p.table.blocks;
  KernelProblem k{p};
  k.largest_block = largest_block;
  k.block_tokens = arrays;
  k.block_start = arrays + n;
  k.token_block = arrays + n + m + 1;
  return k;
}

}  // namespace mhla::cuda
