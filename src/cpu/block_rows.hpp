#pragma once
// Moving one block's rows between the strided [B, N, H, D] tensors and small
// contiguous row-major tiles that the GEMMs read. Gathering costs O(C D) per
// block against the O(C D^2) GEMM work it feeds, and lets 2D/3D tiles (whose
// tokens are not contiguous) use the same GEMMs as 1D blocks.
#include <cstdint>

#include "core/feature_map.hpp"
#include "mhla/layout.hpp"

namespace mhla::cpu {

// Where one (batch, head) slice lives inside a [B, N, H, width] tensor.
struct HeadSlice {
  int64_t offset;  // element offset of (b, token 0, h, 0)
  int64_t stride;  // elements between consecutive tokens: H * width
};

inline HeadSlice head_slice(int64_t b, int64_t h, int64_t tokens, int64_t heads, int64_t width) {
  return {(b * tokens * heads + h) * width, heads * width};
}

namespace detail_rows {
template <FeatureMap Phi, typename T>
void gather_runs(const TokenLayout& layout, int64_t block, const T* src, HeadSlice s,
                 int64_t width, T* dst, int64_t ld) {
  int64_t row = 0;
  layout.for_each_run(block, [&](int64_t first, int64_t len) {
    for (int64_t t = first; t < first + len; ++t, ++row) {
      const T* in = src + s.offset + t * s.stride;
      T* out = dst + row * ld;
      for (int64_t d = 0; d < width; ++d) out[d] = mhla::detail::feature(Phi, in[d]);
    }
  });
}
}  // namespace detail_rows

// dst[row, 0:width] = phi(src[token of row, 0:width]); rows in block order.
template <typename T>
void gather_rows(const TokenLayout& layout, int64_t block, FeatureMap phi, const T* src,
                 HeadSlice s, int64_t width, T* dst, int64_t ld) {
  // The switch sits outside the loops so each loop body is a single inlined map.
  switch (phi) {
    case FeatureMap::identity:
      return detail_rows::gather_runs<FeatureMap::identity>(layout, block, src, s, width, dst, ld);
    case FeatureMap::relu:
      return detail_rows::gather_runs<FeatureMap::relu>(layout, block, src, s, width, dst, ld);
    case FeatureMap::elu1:
      return detail_rows::gather_runs<FeatureMap::elu1>(layout, block, src, s, width, dst, ld);
  }
}

// Calls fn(row, token_pointer_offset) for each row of the block, in block order.
template <typename Fn>
void for_each_row(const TokenLayout& layout, int64_t block, HeadSlice s, Fn&& fn) {
  int64_t row = 0;
  layout.for_each_run(block, [&](int64_t first, int64_t len) {
    for (int64_t t = first; t < first + len; ++t, ++row) fn(row, s.offset + t * s.stride);
  });
}

}  // namespace mhla::cpu
