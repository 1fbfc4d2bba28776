#pragma once
// The blocks of a TokenLayout as a flat table, the form in which kernels
// receive them: plain arrays that a backend can use as they are (CPU) or copy
// to its device, instead of a host object with methods.
//
// Block b's tokens are runs[run_start[b]] .. runs[run_start[b + 1] - 1], each
// a maximal range of consecutive token indices, in row-major order inside the
// block; its rows (tokens) are row_start[b] .. row_start[b + 1] - 1 when the
// blocks are laid end to end. A 1D block is one run; a 2D tile one run per
// tile row.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "mhla/layout.hpp"

namespace mhla::detail {

struct TokenRun {
  int64_t first = 0, length = 0;
};

// Non-owning; valid while the BlockTable it views lives.
struct BlockTableView {
  const int64_t* run_start = nullptr;  // [blocks + 1]
  const int64_t* row_start = nullptr;  // [blocks + 1]
  const TokenRun* runs = nullptr;      // [run_start[blocks]]
  int64_t blocks = 0;
  int64_t max_rows = 0;  // tokens in the largest block

  int64_t block_size(int64_t block) const { return row_start[block + 1] - row_start[block]; }
  int64_t max_block_size() const { return max_rows; }
  // The block's one run of consecutive tokens, or null when it has several.
  const TokenRun* single_run(int64_t block) const {
    return run_start[block + 1] - run_start[block] == 1 ? runs + run_start[block] : nullptr;
  }
  // fn(first_token, run_length) for each run of the block, in order.
  template <typename Fn>
  void for_each_run(int64_t block, Fn&& fn) const {
    for (int64_t r = run_start[block]; r < run_start[block + 1]; ++r)
      fn(runs[r].first, runs[r].length);
  }
};

class BlockTable {
 public:
  explicit BlockTable(const TokenLayout& layout) {
    const int64_t m = layout.num_blocks();
    run_start_.reserve(size_t(m + 1));
    row_start_.reserve(size_t(m + 1));
    run_start_.push_back(0);
    row_start_.push_back(0);
    for (int64_t b = 0; b < m; ++b) {
      layout.for_each_run(b, [&](int64_t first, int64_t length) {
        runs_.push_back({first, length});
      });
      run_start_.push_back(int64_t(runs_.size()));
      row_start_.push_back(row_start_.back() + layout.block_size(b));
      max_rows_ = std::max(max_rows_, layout.block_size(b));
    }
  }
  BlockTableView view() const {
    return {run_start_.data(), row_start_.data(), runs_.data(), int64_t(run_start_.size()) - 1,
            max_rows_};
  }

 private:
  std::vector<int64_t> run_start_, row_start_;
  std::vector<TokenRun> runs_;
  int64_t max_rows_ = 0;
};

}  // namespace mhla::detail
