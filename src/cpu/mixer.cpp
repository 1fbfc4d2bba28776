#include "cpu/mixer.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/block_products.hpp"
#include "cpu/panels.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "mhla/line_aligned.hpp"
#include "mhla_support/blas.hpp"

namespace mhla::cpu {
namespace {

// Column panel of dW (blocks b, one SIMD product panel wide): each panel
// reduces over the full X, keeping dW exact and independent of the thread
// count.
constexpr int64_t kColumnPanel = 64;

// dW's panels run over the inner dimension Dk (Dv + 1) in chunks whose slice
// of S^T (at most this many bytes) stays in L2.
constexpr int64_t kChunkBytes = 256 * 1024;

// out[r * ldo + b] = <a[r, :], s[b, :]> for r < rows, b < cols, over x
// columns (a and s row-major with x columns): a column panel of dW. float on
// the SIMD kernels: S^T formed once per panel (in registers on AVX-512), then one
// product per chunk of the inner dimension: faster than the BLAS pinned to
// AVX2 and as fast as the unpinned one in mhla_bench's "f+b sav" on AVX-512.
// (Without the chunks, or with S^T formed element by element, it was slower.)
void panel_inner_products(int64_t rows, int64_t cols, int64_t x, const float* a, const float* s,
                          float* out, int64_t ldo) {
  thread_local detail::LineAlignedVector<float> transposed;
  transposed.resize(size_t(x * cols));
  transpose(s, x, cols, x, transposed.data());
  const int64_t chunk = std::max<int64_t>(64, kChunkBytes / int64_t(cols * sizeof(float)));
  for (int64_t p0 = 0; p0 < x; p0 += chunk)
    block_gemm(false, false, rows, cols, std::min(chunk, x - p0), 1.0f, a + p0, x,
               transposed.data() + p0 * cols, cols, p0 > 0 ? 1.0f : 0.0f, out, ldo);
}

// double (the checking precision) through the BLAS.
void panel_inner_products(int64_t rows, int64_t cols, int64_t x, const double* a, const double* s,
                          double* out, int64_t ldo) {
  gemm(false, true, rows, cols, x, 1.0, a, x, s, x, 0.0, out, ldo);
}

// The same panel on bfloat16 products (the bfloat16 backward), with `a` given
// as pairs along x (a row's values rounded, in order) and s's rows packed as
// transposed pairs chunk by chunk; the chunks' products are summed in order.
// Faster than the float panel in mhla_bench's bfloat16 table; grad_w's
// largest error on the test catalogue went from 0.052 to 0.054.
void panel_inner_products_bf16(int64_t rows, int64_t cols, int64_t x, simd::PairStrided a,
                               const float* s, float* out, int64_t ldo) {
  thread_local detail::LineAlignedVector<uint32_t> s_pairs;
  thread_local detail::LineAlignedVector<float> partial;
  const int64_t pairs = (x + 1) / 2;
  const int64_t chunk =
      std::max<int64_t>(32, kChunkBytes / int64_t(cols * sizeof(uint32_t)));  // in pairs
  s_pairs.resize(size_t(std::min(chunk, pairs) * cols));
  partial.resize(size_t(rows * cols));
  for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
    const int64_t n = std::min(chunk, pairs - p0);
    simd::pack_transposed_pairs(s + 2 * p0, x, cols, std::min(2 * n, x - 2 * p0), s_pairs.data(),
                                cols);
    const simd::PairStrided chunk_a{a.data + p0 * a.col, a.row, a.col};
    if (p0 == 0) {
      simd::gemm_bf16(rows, cols, n, chunk_a, s_pairs.data(), cols, out, ldo);
      continue;
    }
    simd::gemm_bf16(rows, cols, n, chunk_a, s_pairs.data(), cols, partial.data(), cols);
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + r * ldo;
      const float* q = partial.data() + r * cols;
#pragma omp simd
      for (int64_t b = 0; b < cols; ++b) o[b] += q[b];
    }
  }
}

// Rows of W per product in the masked mixes: four register tiles of six rows.
// Each strip also multiplies the zeros right of its rows' diagonal, up to
// kStrip / 2 extra blocks per row.
constexpr int64_t kStrip = 24;

}  // namespace

template <typename T>
DenseMixer<T>::DenseMixer(const mhla::detail::Problem& problem, const T* w)
    : p_(problem), w_(w), x_(problem.dk * (problem.dv + 1)) {
  if (!p_.lower_triangular()) return;
  // The rows are copied with the entries they do not read (blocks_read_by)
  // zeroed, so that the products below can read them whole.
  const int64_t m = p_.blocks, ms = p_.mixing_blocks, ld = p_.w_stride;
  const int64_t copies = p_.per_head_mixing ? p_.heads : 1;
  masked_.assign(copies * m * ms, T(0));
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t i = 0; i < m; ++i) {
      const T* src = w_ + (c * ld + p_.first_block + i) * ld;
      std::copy(src, src + blocks_read_by(i), masked_.data() + (c * m + i) * ms);
    }
}

template <typename T>
const T* DenseMixer<T>::head_rows(int64_t bh) const {
  const int64_t copy = p_.per_head_mixing ? bh % p_.heads : 0;
  if (!masked_.empty()) return masked_.data() + copy * p_.blocks * p_.mixing_blocks;
  return w_ + (copy * p_.w_stride + p_.first_block) * p_.w_stride;
}

template <typename T>
T DenseMixer<T>::diagonal(int64_t bh, int64_t i) const {
  const int64_t copy = p_.per_head_mixing ? bh % p_.heads : 0, row = p_.first_block + i;
  return w_[(copy * p_.w_stride + row) * p_.w_stride + row];
}

template <typename T>
void DenseMixer<T>::mix(const T* summaries, T* mixed) const {
  const int64_t m = p_.blocks, ms = p_.mixing_blocks, slices = p_.batch * p_.heads;
  for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
    const T* s = summaries + bh * ms * x_ + c0;
    T* out = mixed + bh * m * x_ + c0;
    // On the run-time dispatched SIMD kernels, not the BLAS: they use the
    // cores' AVX-512 even when OpenBLAS is pinned to AVX2 (with AVX2 both
    // run at the same rate).
    if (!p_.lower_triangular()) {
      block_gemm(false, false, m, cols, ms, T(1), head_rows(bh), rows_ld(), s, x_, T(0), out, x_);
      return;
    }
    // Masked rows: strips of rows, each reading the blocks up to the last
    // one its rows read (about half a full product's work).
    for (int64_t i0 = 0; i0 < m; i0 += kStrip) {
      const int64_t rows = std::min(kStrip, m - i0);
      block_gemm(false, false, rows, cols, blocks_read_by(i0 + rows - 1), T(1),
                 head_rows(bh) + i0 * rows_ld(), rows_ld(), s, x_, T(0), out + i0 * x_, x_);
    }
  });
}

template <typename T>
void DenseMixer<T>::mix_bf16(const T* summaries, T* mixed) const {
  if (!takes_summary_pairs()) return mix(summaries, mixed);
  mix_pairs(summaries, nullptr, mixed);
}

template <typename T>
bool DenseMixer<T>::takes_summary_pairs() const {
  return std::is_same_v<T, float> && simd::bf16_products_available();
}

template <typename T>
void DenseMixer<T>::mix_summary_pairs(const uint32_t* summary_pairs, T* mixed) const {
  mix_pairs(nullptr, summary_pairs, mixed);
}

template <typename T>
void DenseMixer<T>::mix_pairs(const T* summaries, const uint32_t* summary_pairs, T* mixed) const {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t m = p_.blocks, ms = p_.mixing_blocks, slices = p_.batch * p_.heads;
    const int64_t pairs = (ms + 1) / 2, copies = p_.per_head_mixing ? p_.heads : 1;
    // W's rows as pairs of blocks, once per call (the masked modes' rows with
    // their unread entries zeroed, as mix() reads them).
    detail::LineAlignedVector<uint32_t> w_pairs(size_t(copies * m * pairs));
    for (int64_t c = 0; c < copies; ++c)
      simd::pack_column_pairs(head_rows(c), rows_ld(), m, ms, w_pairs.data() + c * m * pairs,
                              pairs);
    for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
      // The panel's summaries as pairs of blocks, [pairs, cols] words: read in
      // place when the caller wrote them so, else packed here (512 KiB at
      // M = 256, in L2 while every row tile of W reads them).
      const uint32_t* b = summary_pairs ? summary_pairs + bh * pairs * x_ + c0 : nullptr;
      int64_t ldb = x_;
      if (!summary_pairs) {
        thread_local detail::LineAlignedVector<uint32_t> s_pairs;
        ldb = simd::padded_pair_stride(cols);
        s_pairs.resize(size_t(pairs * ldb));
        simd::pack_row_pairs(summaries + bh * ms * x_ + c0, x_, ms, cols, s_pairs.data(), ldb);
        b = s_pairs.data();
      }
      const uint32_t* w =
          w_pairs.data() + (p_.per_head_mixing ? bh % p_.heads : 0) * m * pairs;
      T* out = mixed + bh * m * x_ + c0;
      if (!p_.lower_triangular()) {
        simd::gemm_bf16(m, cols, pairs, {w, pairs, 1}, b, ldb, out, x_);
        return;
      }
      // Strips as in mix(); an odd count of blocks read takes one more, whose
      // weight is a zeroed entry.
      for (int64_t i0 = 0; i0 < m; i0 += kStrip) {
        const int64_t rows = std::min(kStrip, m - i0);
        simd::gemm_bf16(rows, cols, (blocks_read_by(i0 + rows - 1) + 1) / 2,
                        {w + i0 * pairs, pairs, 1}, b, ldb, out + i0 * x_, x_);
      }
    });
  }
}

template <typename T>
void DenseMixer<T>::mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                                 T* summaries_grad, T* grad_w) const {
  backward(mixed_grad, summaries, diagonal_grad, summaries_grad, grad_w, false);
}

template <typename T>
void DenseMixer<T>::mix_backward_bf16(const T* mixed_grad, const T* summaries,
                                      const T* diagonal_grad, T* summaries_grad, T* grad_w) const {
  backward(mixed_grad, summaries, diagonal_grad, summaries_grad, grad_w,
           std::is_same_v<T, float> && simd::bf16_products_available());
}

template <typename T>
void DenseMixer<T>::backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                             T* summaries_grad, T* grad_w, bool bf16_products) const {
  const int64_t m = p_.blocks, ms = p_.mixing_blocks, heads = p_.heads;
  const int64_t slices = p_.batch * heads;
  // dS = W^T dmixed (masked modes: the masked rows the mix used).
  const auto product = [&](int64_t rows, int64_t cols, int64_t inner, const T* w, const T* g,
                           T* out) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_products)
        return bf16_block_gemm(true, false, rows, cols, inner, w, rows_ld(), g, x_, out, x_);
    }
    block_gemm(true, false, rows, cols, inner, T(1), w, rows_ld(), g, x_, T(0), out, x_);
  };
  for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
    const T* g = mixed_grad + bh * m * x_ + c0;
    T* out = summaries_grad + bh * ms * x_ + c0;
    if (!p_.lower_triangular()) return product(ms, cols, m, head_rows(bh), g, out);
    // Masked rows: block b's gradient gathers the rows i that read it,
    // strip by strip of b from the first row that reads the strip.
    for (int64_t b0 = 0; b0 < ms; b0 += kStrip) {
      const int64_t blocks = std::min(kStrip, ms - b0);
      const int64_t i0 = std::min(m, first_row_reading(b0));
      product(blocks, cols, m - i0, head_rows(bh) + i0 * rows_ld() + b0, g + i0 * x_,
              out + b0 * x_);
    }
  });

  // dW per slice: dW_bh[i, b] = <dmixed_i, S_b>, one panel of columns b per
  // task, so that each S_b is transposed once (panels of rows i formed all of
  // S^T for every panel: at M = 256 four times 4 MiB per slice).
  std::vector<T> per_slice(slices * m * ms, T(0));
  const int64_t column_panels = count_panels(ms, kColumnPanel);
  const int64_t x_pairs = (x_ + 1) / 2;
#pragma omp parallel
  {
    // On bfloat16 products, the slice's dmixed rows as pairs along X, packed
    // once for all its panels: a thread's static share of the tasks is one
    // run, so a slice is packed twice only where two threads split it. Kept
    // per thread: a fresh array per call took away the products' gain.
    thread_local detail::LineAlignedVector<uint32_t> grad_pairs;
    int64_t packed_slice = -1;
    // Rows i0.. of the panel's entries, out at row i0.
    const auto panel = [&](int64_t bh, int64_t i0, int64_t b0, int64_t cols, T* out) {
      const T* s_panel = summaries + (bh * ms + b0) * x_;
      if constexpr (std::is_same_v<T, float>) {
        if (bf16_products) {
          if (packed_slice != bh) {
            grad_pairs.resize(size_t(m * x_pairs));
            simd::pack_column_pairs(mixed_grad + bh * m * x_, x_, m, x_, grad_pairs.data(),
                                    x_pairs);
            packed_slice = bh;
          }
          return panel_inner_products_bf16(
              m - i0, cols, x_, {grad_pairs.data() + i0 * x_pairs, x_pairs, 1}, s_panel, out, ms);
        }
      }
      panel_inner_products(m - i0, cols, x_, mixed_grad + (bh * m + i0) * x_, s_panel, out, ms);
    };
#pragma omp for schedule(static)
    for (int64_t task = 0; task < slices * column_panels; ++task) {
      const int64_t bh = task / column_panels, b0 = (task % column_panels) * kColumnPanel;
      const int64_t cols = std::min(kColumnPanel, ms - b0);
      T* out = per_slice.data() + bh * m * ms;
      // Masked: the rows before the first one reading b0 read none of the
      // panel's blocks (their entries stay zero).
      const int64_t i0 = p_.lower_triangular() ? std::min(m, first_row_reading(b0)) : 0;
      if (i0 < m) panel(bh, i0, b0, cols, out + i0 * ms + b0);
      for (int64_t i = 0; i < m && p_.lower_triangular(); ++i) {
        const int64_t row = p_.first_block + i;
        // Unread entries get zero gradient; the causal diagonal comes from the
        // in-block term (diagonal_grad, when given) instead of the mix.
        for (int64_t b = std::max(b0, std::min(ms, row + 1)); b < b0 + cols; ++b)
          out[i * ms + b] = 0;
        if (p_.causal && row >= b0 && row < b0 + cols)
          out[i * ms + row] = diagonal_grad ? diagonal_grad[bh * m + i] : T(0);
      }
    }
  }

  // Sum over the batch (and the heads when W is shared) in a fixed order, a
  // row of dW at a time so that the sums vectorise.
  const int64_t copies = p_.per_head_mixing ? heads : 1, ld = p_.w_stride;
#pragma omp parallel
  {
    std::vector<T> acc(static_cast<size_t>(ms));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < copies * m; ++row) {
      const int64_t c = row / m, i = row % m;
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t bh = 0; bh < slices; ++bh) {
        if (p_.per_head_mixing && bh % heads != c) continue;
        const T* slice_row = per_slice.data() + (bh * m + i) * ms;
#pragma omp simd
        for (int64_t b = 0; b < ms; ++b) acc[b] += slice_row[b];
      }
      T* out = grad_w + (c * ld + p_.first_block + i) * ld;
#pragma omp simd
      for (int64_t b = 0; b < ms; ++b) out[b] += acc[b];
    }
  }
}

template <typename T>
UniformMixer<T>::UniformMixer(const mhla::detail::Problem& problem)
    : p_(problem), x_(problem.dk * (problem.dv + 1)) {}

template <typename T>
void UniformMixer<T>::mix(const T* summaries, T* mixed) const {
  const int64_t m = p_.blocks, slices = p_.batch * p_.heads;
  for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
    const T* s = summaries + bh * m * x_ + c0;
    T* out = mixed + bh * m * x_ + c0;
    if (p_.causal) {  // mixed_i = sum_{b<i} S_b
      std::fill(out, out + cols, T(0));
      for (int64_t i = 1; i < m; ++i)
        for (int64_t c = 0; c < cols; ++c)
          out[i * x_ + c] = out[(i - 1) * x_ + c] + s[(i - 1) * x_ + c];
    } else {  // mixed_i = sum_b S_b for every i
      std::copy(s, s + cols, out);
      for (int64_t b = 1; b < m; ++b)
        for (int64_t c = 0; c < cols; ++c) out[c] += s[b * x_ + c];
      for (int64_t i = 1; i < m; ++i) std::copy(out, out + cols, out + i * x_);
    }
  });
}

template <typename T>
void UniformMixer<T>::mix_backward(const T* mixed_grad, const T*, const T*, T* summaries_grad,
                                   T*) const {
  const int64_t m = p_.blocks, slices = p_.batch * p_.heads;
  for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
    const T* g = mixed_grad + bh * m * x_ + c0;
    T* out = summaries_grad + bh * m * x_ + c0;
    if (p_.causal) {  // dS_b = sum_{i>b} dmixed_i
      std::fill(out + (m - 1) * x_, out + (m - 1) * x_ + cols, T(0));
      for (int64_t b = m - 2; b >= 0; --b)
        for (int64_t c = 0; c < cols; ++c)
          out[b * x_ + c] = out[(b + 1) * x_ + c] + g[(b + 1) * x_ + c];
    } else {  // dS_b = sum_i dmixed_i for every b
      std::copy(g, g + cols, out);
      for (int64_t i = 1; i < m; ++i)
        for (int64_t c = 0; c < cols; ++c) out[c] += g[i * x_ + c];
      for (int64_t b = 1; b < m; ++b) std::copy(out, out + cols, out + b * x_);
    }
  });
}

template class DenseMixer<float>;
template class DenseMixer<double>;
template class UniformMixer<float>;
template class UniformMixer<double>;

}  // namespace mhla::cpu
