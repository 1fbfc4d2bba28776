#pragma once
// How the N tokens of a sequence map onto the M blocks of MHLA.
//
// Tokens form a row-major grid of rank 1, 2 or 3 (sequence, image, video) that
// is cut into tiles; blocks are numbered row-major over the grid of tiles, and
// edge tiles may be smaller than the tile (ragged edges). Internally every
// layout is stored as a 3D grid (T, H, W) with leading extents of 1, so one
// code path serves all ranks.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

namespace mhla {

class TokenLayout {
 public:
  TokenLayout() = default;  // empty: rejected by the operator until set

  // 1D sequence of n tokens in blocks of `block` tokens: M = ceil(n / block).
  static TokenLayout sequence(int64_t n, int64_t block);
  // 2D grid of gh x gw tokens in tiles of th x tw.
  static TokenLayout grid2d(int64_t gh, int64_t gw, int64_t th, int64_t tw);
  // 3D grid of gt x gh x gw tokens in tiles of tt x th x tw.
  static TokenLayout grid3d(int64_t gt, int64_t gh, int64_t gw, int64_t tt, int64_t th, int64_t tw);

  int rank() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  int64_t num_tokens() const { return grid_[0] * grid_[1] * grid_[2]; }
  int64_t num_blocks() const { return blocks_[0] * blocks_[1] * blocks_[2]; }
  // Number of tokens in the largest (full) tile.
  int64_t max_block_size() const { return tile_[0] * tile_[1] * tile_[2]; }
  int64_t block_size(int64_t block) const;
  int64_t block_of(int64_t token) const;

  // Grid, tile and block-grid extents as (T, H, W).
  const std::array<int64_t, 3>& grid() const { return grid_; }
  const std::array<int64_t, 3>& tile() const { return tile_; }
  const std::array<int64_t, 3>& block_grid() const { return blocks_; }

  // Visits the tokens of `block` as maximal runs of consecutive token indices,
  // in row-major order inside the block: fn(first_token, run_length). A 1D
  // block is one run; a 2D tile is one run per tile row.
  template <typename Fn>
  void for_each_run(int64_t block, Fn&& fn) const {
    const int64_t bt = block / (blocks_[1] * blocks_[2]);
    const int64_t bh = (block / blocks_[2]) % blocks_[1];
    const int64_t bw = block % blocks_[2];
    const int64_t t0 = bt * tile_[0], h0 = bh * tile_[1], w0 = bw * tile_[2];
    const int64_t t1 = std::min(t0 + tile_[0], grid_[0]);
    const int64_t h1 = std::min(h0 + tile_[1], grid_[1]);
    const int64_t w1 = std::min(w0 + tile_[2], grid_[2]);
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = h0; h < h1; ++h) fn((t * grid_[1] + h) * grid_[2] + w0, w1 - w0);
  }

  // "1D: 4096 tokens in blocks of 64 (64 blocks)" and similar.
  std::string describe() const;

  friend bool operator==(const TokenLayout&, const TokenLayout&) = default;

 private:
  TokenLayout(int rank, std::array<int64_t, 3> grid, std::array<int64_t, 3> tile);

  int rank_ = 0;
  std::array<int64_t, 3> grid_{0, 0, 0};
  std::array<int64_t, 3> tile_{1, 1, 1};
  std::array<int64_t, 3> blocks_{0, 0, 0};
};

}  // namespace mhla
