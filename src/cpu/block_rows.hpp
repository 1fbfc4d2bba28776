#pragma once
// Moving one block's rows between the strided [B, N, H, D] tensors and small
// contiguous row-major tiles that the GEMMs read. Gathering costs O(C D) per
// block against the O(C D^2) GEMM work it feeds, and lets 2D/3D tiles (whose
// tokens are not contiguous) use the same GEMMs as 1D blocks. Each row loop is
// instantiated per feature map so it vectorises.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/block_table.hpp"
#include "core/feature_map.hpp"
#include "cpu/row_bias.hpp"
#include "cpu/row_writer.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/block_gemm.hpp"
#include "cpu/simd/feature_map.hpp"
#include "cpu/simd/prefetch.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {

// Where one (batch, head) slice lives inside a [B, N, H, width] tensor.
struct HeadSlice {
  int64_t offset;  // element offset of (b, token 0, h, 0)
  int64_t stride;  // elements between consecutive tokens: H * width
};

inline HeadSlice head_slice(int64_t b, int64_t h, int64_t tokens, int64_t heads, int64_t width) {
  return {(b * tokens * heads + h) * width, heads * width};
}

using simd::prefetch_ahead;

// Calls fn(row, element_offset) for each row of the block, in block order.
template <typename Fn>
void for_each_row(const mhla::detail::BlockTableView& layout, int64_t block, HeadSlice s, Fn&& fn) {
  int64_t row = 0;
  layout.for_each_run(block, [&](int64_t first, int64_t len) {
    for (int64_t t = first; t < first + len; ++t, ++row) fn(row, s.offset + t * s.stride);
  });
}

// The cache lines of some blocks' rows, each run marked as to be read or to
// be written, for a product to request while it runs (simd::LineRuns): the
// kernels list the next task's rows, which then arrive while the cores
// compute.
class RowLines {
 public:
  void clear() { runs_.clear(); }
  template <typename T>
  void add_read(const mhla::detail::BlockTableView& layout, int64_t block, const T* src,
                HeadSlice s, int64_t width) {
    append(layout, block, src, s, width, false);
  }
  template <typename T>
  void add_write(const mhla::detail::BlockTableView& layout, int64_t block, const T* dst,
                 HeadSlice s, int64_t width) {
    append(layout, block, dst, s, width, true);
  }
  // `count` contiguous elements from `first` (a block's summary, mixed
  // summary or their gradients): 16 KiB at Dk = Dv = 64, which would otherwise
  // be read or written from memory at the task's start.
  template <typename T>
  void add_span_read(const T* first, int64_t count) {
    push(first, count, 0, 1, false);
  }
  template <typename T>
  void add_span_write(const T* first, int64_t count) {
    push(first, count, 0, 1, true);
  }
  simd::LineRuns prefetch() const { return {runs_.data(), int64_t(runs_.size())}; }

 private:
  template <typename T>
  void append(const mhla::detail::BlockTableView& layout, int64_t block, const T* src, HeadSlice s,
              int64_t width, bool write) {
    layout.for_each_run(block, [&](int64_t first, int64_t len) {
      push(src + s.offset + first * s.stride, width, s.stride * int64_t(sizeof(T)), len, write);
    });
  }

  // `rows` rows of `width` elements from `row`, `stride` bytes apart.
  template <typename T>
  void push(const T* row, int64_t width, int64_t stride, int64_t rows, bool write) {
    constexpr uintptr_t kLine = mhla::detail::kCacheLine;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(row);
    const uintptr_t start = begin & ~(kLine - 1), end = begin + uintptr_t(width) * sizeof(T);
    runs_.push_back({reinterpret_cast<const char*>(start), stride, rows,
                     int64_t((end - start + kLine - 1) / kLine), write});
  }

  std::vector<simd::LineRuns::Run> runs_;
};

// tile[row, 0:width] = phi(src[token of row, 0:width]).
template <typename T>
void gather_rows(const mhla::detail::BlockTableView& layout, int64_t block, FeatureMap phi,
                 const T* src, HeadSlice s, int64_t width, T* tile, int64_t ld) {
  // float: phi applied as each run of consecutive tokens is copied, by the
  // SIMD kernel. The kernels request the rows during the product before (see
  // RowLines), so the copy reads cache (when it read memory, fusing the exp
  // of elu+1 into it made mhla_bench's forward slower).
  if constexpr (std::is_same_v<T, float>) {
    if (phi != FeatureMap::identity) {
      int64_t row = 0;
      layout.for_each_run(block, [&](int64_t first, int64_t len) {
        simd::apply_feature(phi, src + s.offset + first * s.stride, s.stride, tile + row * ld, len,
                            width, ld);
        row += len;
      });
      return;
    }
  }
  // Otherwise a plain strided copy, then phi (double) on the tile while it
  // sits in L1/L2.
  int64_t rows = 0;
  for_each_row(layout, block, s, [&](int64_t row, int64_t offset) {
    prefetch_ahead(src + offset, s.stride, width);
    std::copy(src + offset, src + offset + width, tile + row * ld);
    rows = row + 1;
  });
  if (phi == FeatureMap::identity) return;
  mhla::detail::dispatch_feature(phi, [&]<FeatureMap Phi>() {
    for (int64_t row = 0; row < rows; ++row) {
      T* x = tile + row * ld;
#pragma omp simd
      for (int64_t d = 0; d < width; ++d) x[d] = mhla::detail::apply_feature<Phi>(x[d]);
    }
  });
}

// tile[row, 0:width] = phi(src[token of row, 0:width]) for bfloat16 rows,
// widened (exactly) to float by the bfloat16 kernels, one pass per run of
// consecutive tokens; with `pairs`, phi's values rounded to bfloat16 too, as
// pairs of columns (simd::feature_rows).
inline void gather_rows(const mhla::detail::BlockTableView& layout, int64_t block, FeatureMap phi,
                        const bfloat16* src, HeadSlice s, int64_t width, float* tile, int64_t ld,
                        uint32_t* pairs = nullptr, int64_t ld_pairs = 0) {
  int64_t row = 0;
  layout.for_each_run(block, [&](int64_t first, int64_t len) {
    simd::feature_rows(phi, src + s.offset + first * s.stride, s.stride, tile + row * ld, len,
                       width, ld, pairs ? pairs + row * ld_pairs : nullptr, ld_pairs);
    row += len;
  });
}

// phi of the block's bfloat16 rows as pairs of rows (simd::feature_row_pairs),
// the B operand of the bfloat16 products or A^T; with `sums`, each column's
// sum of the float phi values in sums[0, width), and with `tile`, those
// values as gather_rows writes them.
inline void gather_feature_row_pairs(const mhla::detail::BlockTableView& layout, int64_t block,
                                     FeatureMap phi, const bfloat16* src, HeadSlice s,
                                     int64_t width, uint32_t* dst, int64_t ldd, float* sums,
                                     float* tile = nullptr, int64_t ld_tile = 0) {
  if (sums) std::fill(sums, sums + width, 0.0f);
  int64_t row = 0;
  layout.for_each_run(block, [&](int64_t first, int64_t len) {
    simd::feature_row_pairs(phi, src + s.offset + first * s.stride, s.stride, row, len, width, dst,
                            ldd, sums, tile ? tile + row * ld_tile : nullptr, ld_tile);
    row += len;
  });
}

// The block's bfloat16 rows as pairs of columns, the A operand of the
// bfloat16 products (simd::PairStrided{dst, ldd, 1}): row r's values in
// order, an odd last column paired with zero. The bits are moved, not
// converted.
inline void gather_column_pairs(const mhla::detail::BlockTableView& layout, int64_t block,
                                const bfloat16* src, HeadSlice s, int64_t width, uint32_t* dst,
                                int64_t ldd) {
  for_each_row(layout, block, s, [&](int64_t row, int64_t offset) {
    prefetch_ahead(src + offset, s.stride, width);
    bfloat16* out = reinterpret_cast<bfloat16*>(dst + row * ldd);
    std::copy(src + offset, src + offset + width, out);
    if (width % 2) out[width] = bfloat16{};
  });
}

// The block's bfloat16 rows in pairs, as the B operand of the bfloat16
// products (simd::gemm_bf16): dst[p * ldd + j] holds row 2p's element j in its
// low half and row 2p + 1's in its high half; an odd last row is paired with
// zero. The bits are moved, not converted.
inline void gather_row_pairs(const mhla::detail::BlockTableView& layout, int64_t block,
                             const bfloat16* src, HeadSlice s, int64_t width, uint32_t* dst,
                             int64_t ldd) {
  const bfloat16* even = nullptr;
  int64_t rows = 0;
  for_each_row(layout, block, s, [&](int64_t row, int64_t offset) {
    const bfloat16* x = src + offset;
    prefetch_ahead(x, s.stride, width);
    rows = row + 1;
    if (row % 2 == 0) {
      even = x;
      return;
    }
    uint32_t* out = dst + (row / 2) * ldd;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out[j] = uint32_t(even[j].bits) | uint32_t(x[j].bits) << 16;
  });
  if (rows % 2 == 0) return;
  uint32_t* out = dst + (rows / 2) * ldd;
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) out[j] = uint32_t(even[j].bits);
}

// The scatters below write their rows through the thread's RowWriter for dst
// (which says whether they add to it; its mode is read once and the rows it
// targets are restrict: otherwise GCC left these loops scalar), and also
// return whether every value they wrote is finite (x * 0 is NaN exactly when
// x is infinite or NaN; a sum of two finite values can overflow). Folded into
// the rows' writes the probe costs nothing measurable, where separate passes
// over the source tiles showed in a forward+backward profile.

// Gradient of phi(x) back to x, given features = phi(x) as a tile:
//   dst[token, d] = phi'(x) * (grad[row, d] + b[row, d] + (accumulating ? dst[token, d] : 0))
// with b the bias (RowBias: its scaled values as one multiply-add, none
// without values). phi' is finite and in [0, 1], so without accumulation the
// result is finite exactly where grad + b is.
template <typename T>
bool scatter_through_feature(const mhla::detail::BlockTableView& layout, int64_t block,
                             FeatureMap phi, const T* features, const T* grad, int64_t ld,
                             HeadSlice s, int64_t width, RowWriter<T>& writer, T* dst,
                             RowBias<T> bias = {}) {
  const bool accumulate = writer.accumulating(), streaming = writer.streaming();
  T probe = 0;
  // The bias and phi as template arguments: each loop below then vectorises
  // without a test per element.
  const auto rows = [&]<FeatureMap Phi, bool kBias>() {
    for_each_row(layout, block, s, [&](int64_t row, int64_t offset) {
      const T* y = features + row * width;
      const T* g = grad + row * ld;
      const T* b = bias.values;
      const T scale = bias.scales ? bias.scales[row] : T(1);
      T* out = dst + offset;
      if (!streaming) prefetch_ahead(out, s.stride, width);
      T row_probe = 0;
      if (accumulate) {
#pragma omp simd reduction(+ : row_probe)
        for (int64_t d = 0; d < width; ++d) {
          const T gd = kBias ? g[d] + b[d] * scale : g[d];
          const T x = mhla::detail::derivative_from_feature<Phi>(y[d]) * (gd + out[d]);
          out[d] = x;
          row_probe += x * T(0);
        }
      } else {
        T* __restrict x = writer.target(out);
#pragma omp simd reduction(+ : row_probe)
        for (int64_t d = 0; d < width; ++d) {
          const T gd = kBias ? g[d] + b[d] * scale : g[d];
          const T value = mhla::detail::derivative_from_feature<Phi>(y[d]) * gd;
          x[d] = value;
          row_probe += value * T(0);
        }
      }
      probe += row_probe;
    });
  };
  mhla::detail::dispatch_feature(phi, [&]<FeatureMap Phi>() {
    if (bias.values)
      rows.template operator()<Phi, true>();
    else
      rows.template operator()<Phi, false>();
  });
  return probe == probe;
}

// dst[token, 0:width] = tile[row, 0:width] (+ dst when accumulating).
template <typename T>
bool scatter_rows(const mhla::detail::BlockTableView& layout, int64_t block, const T* tile,
                  int64_t ld, HeadSlice s, int64_t width, RowWriter<T>& writer, T* dst) {
  const bool accumulate = writer.accumulating(), streaming = writer.streaming();
  T probe = 0;
  for_each_row(layout, block, s, [&](int64_t row, int64_t offset) {
    const T* g = tile + row * ld;
    T* out = dst + offset;
    if (!streaming) prefetch_ahead(out, s.stride, width);
    T row_probe = 0;
    if (accumulate) {
#pragma omp simd reduction(+ : row_probe)
      for (int64_t d = 0; d < width; ++d) {
        const T x = g[d] + out[d];
        out[d] = x;
        row_probe += x * T(0);
      }
    } else {
      T* __restrict x = writer.target(out);
#pragma omp simd reduction(+ : row_probe)
      for (int64_t d = 0; d < width; ++d) {
        const T value = g[d];
        x[d] = value;
        row_probe += value * T(0);
      }
    }
    probe += row_probe;
  });
  return probe == probe;
}

// The scatters for bfloat16 destinations (the bfloat16 backward): the block's
// rows formed, rounded, probed and (when the writer streams) streamed by one
// call of simd::narrow_gradients, so only where
// simd::bf16_products_available(); `bias` (RowBias) is added to grad's
// rows first. Accumulating reads the old bfloat16 values. (One call a block,
// with dz as the bias, is what made key_value_gradients' bfloat16 scatters
// cheap in mhla_bench: formed in a float row and narrowed row by row through
// the writer's buffer, they were a third of the phase.)
inline bool scatter_through_feature(const mhla::detail::BlockTableView& layout, int64_t block,
                                    FeatureMap phi, const float* features, const float* grad,
                                    int64_t ld, HeadSlice s, int64_t width,
                                    RowWriter<bfloat16>& writer, bfloat16* dst,
                                    RowBias<float> bias = {}) {
  thread_local std::vector<bfloat16*> rows;
  rows.clear();
  for_each_row(layout, block, s, [&](int64_t, int64_t offset) {
    bfloat16* out = dst + offset;
    if (!writer.streaming()) prefetch_ahead(out, s.stride, width);
    rows.push_back(out);
  });
  const float probe =
      simd::narrow_gradients(phi, features, width, grad, ld, bias, writer.accumulating(),
                             int64_t(rows.size()), width, rows.data(), writer.streaming());
  return probe == probe;
}

inline bool scatter_rows(const mhla::detail::BlockTableView& layout, int64_t block,
                         const float* tile, int64_t ld, HeadSlice s, int64_t width,
                         RowWriter<bfloat16>& writer, bfloat16* dst) {
  return scatter_through_feature(layout, block, FeatureMap::identity, nullptr, tile, ld, s, width,
                                 writer, dst);
}

}  // namespace mhla::cpu
