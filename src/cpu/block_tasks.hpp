#pragma once
// The unit of work of the blocked kernels: one block of one (batch, head)
// slice. Tasks run heads innermost: a thread then reads the H * D consecutive
// values of each token in turn (whole rows of the [B, N, H, D] tensors)
// instead of one head's D values at a stride.
#include <cstdint>

#include "core/validate.hpp"
#include "cpu/block_rows.hpp"

namespace mhla::cpu {

struct BlockTask {
  int64_t bh, block, rows;
  HeadSlice qk, v;  // this head's rows in the [B, N, H, Dk] and [B, N, H, Dv] tensors
  int64_t summary;  // element offset of this block's [Dk, Dv + 1] summary
};

inline int64_t task_count(const mhla::detail::Problem& p) {
  return p.batch * p.heads * p.blocks;
}

inline BlockTask block_task(const mhla::detail::Problem& p, int64_t task) {
  const auto& d = p;
  const int64_t h = task % d.heads, rest = task / d.heads;
  const int64_t blk = rest % p.blocks, b = rest / p.blocks, bh = b * d.heads + h;
  return {bh,
          blk,
          p.table.block_size(blk),
          head_slice(b, h, d.tokens, d.heads, d.dk),
          head_slice(b, h, d.tokens, d.heads, d.dv),
          (bh * p.blocks + blk) * d.dk * (d.dv + 1)};
}

}  // namespace mhla::cpu
