#pragma once
// The row tiles of a product's column panel. The products' register tiles
// (block_gemm.cpp, bf16_products.cpp) are templates on their row count, so
// the rows of the last, shorter tile become a compile-time constant here.
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mhla::cpu::simd {

// tile(std::integral_constant<int, rows>{}), 1 <= rows <= kMaxRows.
template <int kMaxRows, class Tile>
inline void with_tile_rows(int64_t rows, const Tile& tile) {
  if constexpr (kMaxRows > 1)
    if (rows < kMaxRows) return with_tile_rows<kMaxRows - 1>(rows, tile);
  tile(std::integral_constant<int, kMaxRows>{});
}

// tile(R, i0) for the tiles of m rows, kMaxRows each from row 0 and R the
// rows left for the last. tile is compiled for the product's instruction
// set and this loop for the build's, so the product that calls it is
// flattened (`flatten`: everything it calls inlines into it, within its
// instruction set), leaving no call per tile.
template <int kMaxRows, class Tile>
void for_each_row_tile(int64_t m, const Tile& tile) {
  for (int64_t i0 = 0; i0 < m; i0 += kMaxRows)
    with_tile_rows<kMaxRows>(std::min<int64_t>(kMaxRows, m - i0),
                             [&](auto rows) { tile(rows, i0); });
}

}  // namespace mhla::cpu::simd
