#include "mhla/shards.hpp"

#include <string>

#include "mhla/error.hpp"

namespace mhla {
namespace {

// The layout of `extent` slices of `layout` along its first axis: the same
// tiles, the same extents along the other axes.
TokenLayout slice_layout(const TokenLayout& layout, int64_t extent) {
  const auto& g = layout.grid();
  const auto& t = layout.tile();
  switch (layout.rank()) {
    case 1:
      return TokenLayout::sequence(extent, t[2]);
    case 2:
      return TokenLayout::grid2d(extent, g[2], t[1], t[2]);
    default:
      return TokenLayout::grid3d(extent, g[1], g[2], t[0], t[1], t[2]);
  }
}

}  // namespace

std::vector<Shard> plan_shards(const TokenLayout& layout,
                               const std::vector<int64_t>& tokens_per_rank) {
  const char* fn = "mhla::plan_shards: ";
  if (layout.empty()) throw Error(std::string(fn) + "options.layout is empty; set it");
  if (tokens_per_rank.empty()) throw Error(std::string(fn) + "no ranks");
  // Axis a of the internal (T, H, W) grid is the layout's first axis.
  const int a = 3 - layout.rank();
  const char* slice = layout.rank() == 1 ? "token" : layout.rank() == 2 ? "grid row" : "frame";
  int64_t slice_tokens = 1, slice_blocks = 1;
  for (int d = a + 1; d < 3; ++d) {
    slice_tokens *= layout.grid()[d];
    slice_blocks *= layout.block_grid()[d];
  }
  const int64_t extent_total = layout.grid()[a], tile = layout.tile()[a];

  int64_t total = 0;
  for (int64_t tokens : tokens_per_rank) total += tokens;
  if (total != layout.num_tokens())
    throw Error(std::string(fn) + "the ranks hold " + std::to_string(total) +
                " tokens in all, but the layout (" + layout.describe() + ") has " +
                std::to_string(layout.num_tokens()));

  std::vector<Shard> shards;
  int64_t start = 0;  // in slices along axis a
  for (size_t r = 0; r < tokens_per_rank.size(); ++r) {
    const std::string rank = "rank " + std::to_string(r);
    const int64_t tokens = tokens_per_rank[r];
    if (tokens <= 0)
      throw Error(fn + rank + " holds " + std::to_string(tokens) +
                  " tokens; every rank needs at least one block");
    if (tokens % slice_tokens != 0)
      throw Error(fn + rank + " holds " + std::to_string(tokens) + " tokens, not whole " + slice +
                  "s of " + std::to_string(slice_tokens) + " tokens (" + layout.describe() +
                  "); a shard is cut along the first axis");
    const int64_t extent = tokens / slice_tokens, end = start + extent;
    // Each earlier shard ended at a tile boundary, so this one starts at one.
    if (end % tile != 0 && end != extent_total)
      throw Error(fn + rank + " holds tokens " + std::to_string(start * slice_tokens) + ".." +
                  std::to_string(end * slice_tokens - 1) + ", which ends inside block " +
                  std::to_string((end / tile) * slice_blocks) + " (" + layout.describe() +
                  "); a shard must end at a block boundary");
    Shard s;
    s.first_token = start * slice_tokens;
    s.tokens = tokens;
    s.first_block = (start / tile) * slice_blocks;
    s.blocks = ((extent + tile - 1) / tile) * slice_blocks;
    s.layout = slice_layout(layout, extent);
    shards.push_back(s);
    start = end;
  }
  return shards;
}

bool reads_blocks_of(bool masked, int reader, int owner) { return masked ? owner <= reader : true; }

}  // namespace mhla
