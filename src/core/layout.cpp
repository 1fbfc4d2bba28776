#include "mhla/layout.hpp"

#include <sstream>

#include "mhla/error.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla {
namespace {

void require_positive(const char* what, int64_t value) {
  if (value <= 0)
    throw Error("TokenLayout: " + std::string(what) + " must be positive, got " +
                std::to_string(value));
}

}  // namespace

TokenLayout::TokenLayout(int rank, std::array<int64_t, 3> grid, std::array<int64_t, 3> tile)
    : rank_(rank), grid_(grid), tile_(tile) {
  static const char* grid_names[] = {"grid extent T", "grid extent H", "grid extent W"};
  static const char* tile_names[] = {"tile extent T", "tile extent H", "tile extent W"};
  for (int d = 0; d < 3; ++d) {
    require_positive(grid_names[d], grid_[d]);
    require_positive(tile_names[d], tile_[d]);
    // A tile larger than the grid is legal: the grid is one ragged block along d.
    tile_[d] = std::min(tile_[d], grid_[d]);
    blocks_[d] = (grid_[d] + tile_[d] - 1) / tile_[d];
  }
  detail::checked_product({grid_[0], grid_[1], grid_[2]}, "TokenLayout: number of tokens");
}

TokenLayout TokenLayout::sequence(int64_t n, int64_t block) {
  return TokenLayout(1, {1, 1, n}, {1, 1, block});
}

TokenLayout TokenLayout::grid2d(int64_t gh, int64_t gw, int64_t th, int64_t tw) {
  return TokenLayout(2, {1, gh, gw}, {1, th, tw});
}

TokenLayout TokenLayout::grid3d(int64_t gt, int64_t gh, int64_t gw, int64_t tt, int64_t th,
                                int64_t tw) {
  return TokenLayout(3, {gt, gh, gw}, {tt, th, tw});
}

int64_t TokenLayout::block_size(int64_t block) const {
  int64_t size = 0;
  for_each_run(block, [&](int64_t, int64_t len) { size += len; });
  return size;
}

int64_t TokenLayout::block_of(int64_t token) const {
  const int64_t t = token / (grid_[1] * grid_[2]);
  const int64_t h = (token / grid_[2]) % grid_[1];
  const int64_t w = token % grid_[2];
  return ((t / tile_[0]) * blocks_[1] + h / tile_[1]) * blocks_[2] + w / tile_[2];
}

std::string TokenLayout::describe() const {
  std::ostringstream out;
  switch (rank_) {
    case 0:
      out << "empty layout";
      break;
    case 1:
      out << "1D: " << grid_[2] << " tokens in blocks of " << tile_[2];
      break;
    case 2:
      out << "2D: " << grid_[1] << "x" << grid_[2] << " grid in " << tile_[1] << "x" << tile_[2]
          << " tiles";
      break;
    default:
      out << "3D: " << grid_[0] << "x" << grid_[1] << "x" << grid_[2] << " grid in " << tile_[0]
          << "x" << tile_[1] << "x" << tile_[2] << " tiles";
  }
  if (rank_ > 0) out << " (" << num_blocks() << " blocks)";
  return out.str();
}

}  // namespace mhla
