// Highway compiles this file once per target instruction set (foreach_target
// re-includes it); HWY_EXPORT collects the per-target GemmImpl in a table and
// HWY_DYNAMIC_DISPATCH calls the best one the CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/block_gemm.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <algorithm>

#include "cpu/simd/block_gemm.hpp"
#include "cpu/simd/partial_vectors-inl.h"
#include "cpu/simd/prefetch.hpp"
#include "cpu/simd/row_tiles.hpp"

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A register tile of C: kRows rows by kVectors vectors. Per step of the inner
// dimension it loads kVectors vectors of B's row and broadcasts kRows values
// of A's column, for kRows * kVectors fused multiply-adds. With 32 vector
// registers (AVX-512) 6 x 4 accumulators fit beside B's row and a broadcast;
// with 16 (AVX2, SSE4), 6 x 2.
constexpr int kRows = 6;
constexpr int kMaxVectors = HWY_MAX_BYTES >= 64 ? 4 : 2;

struct Operands {
  int64_t k;
  float alpha;
  Strided a;
  const float* b;
  int64_t ldb;
  bool accumulate;
  float* c;
  int64_t ldc;
};

// The tile whose top-left element is C[i0, j0]. With kMasked the last vector
// covers only `tail` columns: loads read nothing past them and stores write
// nothing past them.
template <int R, int V, bool kMasked>
HWY_INLINE void Tile(const Operands& o, int64_t i0, int64_t j0, size_t tail,
                     PrefetchCursor& prefetch) {
  const Tag d;
  const size_t lanes = hn::Lanes(d);
  VecF acc[R][V];
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(d);

  const float* HWY_RESTRICT a = o.a.data + i0 * o.a.row;
  const float* HWY_RESTRICT b = o.b + j0;
  for (int64_t p = 0; p < o.k; ++p, a += o.a.col, b += o.ldb) {
    // One requested line per step, so that the requests never pile up beyond
    // the miss buffers (every other step left lines unrequested).
    prefetch.Next();
    VecF bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] =
          (kMasked && v == V - 1) ? LoadFirst(b + v * lanes, tail) : hn::LoadU(d, b + v * lanes);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const VecF ar = hn::Set(d, a[r * o.a.row]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(ar, bv[v], acc[r][v]);
    }
  }

  const VecF alpha = hn::Set(d, o.alpha);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* HWY_RESTRICT c = o.c + (i0 + r) * o.ldc + j0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      VecF x = hn::Mul(acc[r][v], alpha);
      if (kMasked && v == V - 1) {
        if (o.accumulate) x = hn::Add(x, LoadFirst(c + v * lanes, tail));
        StoreFirst(x, c + v * lanes, tail);
      } else {
        if (o.accumulate) x = hn::Add(x, hn::LoadU(d, c + v * lanes));
        hn::StoreU(x, d, c + v * lanes);
      }
    }
  }
}

template <int R>
HWY_INLINE void TileOfWidth(const Operands& o, int64_t i0, int64_t j0, int vectors, size_t tail,
                            bool masked, PrefetchCursor& pf) {
  switch (vectors) {
    case 1:
      return masked ? Tile<R, 1, true>(o, i0, j0, tail, pf)
                    : Tile<R, 1, false>(o, i0, j0, tail, pf);
    case 2:
      return masked ? Tile<R, 2, true>(o, i0, j0, tail, pf)
                    : Tile<R, 2, false>(o, i0, j0, tail, pf);
    default:
      if constexpr (kMaxVectors >= 4) {
        if (vectors == 3)
          return masked ? Tile<R, 3, true>(o, i0, j0, tail, pf)
                        : Tile<R, 3, false>(o, i0, j0, tail, pf);
        return masked ? Tile<R, 4, true>(o, i0, j0, tail, pf)
                      : Tile<R, 4, false>(o, i0, j0, tail, pf);
      }
  }
}

// Flattened: the row tiles' calls through for_each_row_tile inline here.
HWY_FLATTEN void GemmImpl(int64_t m, int64_t n, int64_t k, float alpha, Strided a, const float* b,
                          int64_t ldb, bool accumulate, float* c, int64_t ldc, LineRuns prefetch) {
  const Operands o{k, alpha, a, b, ldb, accumulate, c, ldc};
  const int64_t lanes = int64_t(hn::Lanes(Tag()));
  const int64_t panel = kMaxVectors * lanes;
  PrefetchCursor pf(prefetch);
  // Column panels outside, row tiles inside: a panel of B (k rows of at most
  // kMaxVectors vectors) stays in L1 while every row tile streams past it.
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t cols = std::min(panel, n - j0);
    const int vectors = int((cols + lanes - 1) / lanes);
    const size_t tail = size_t(cols - (vectors - 1) * lanes);
    const bool masked = int64_t(tail) != lanes;
    for_each_row_tile<kRows>(m, [&](auto rows, int64_t i0) {
      TileOfWidth<decltype(rows)::value>(o, i0, j0, vectors, tail, masked, pf);
    });
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// dst[p * ldd + j] = b[j * ldb + p] for a 16 x 16 square: sixteen rows loaded,
// interleaved in pairs of floats, then of pairs, which leaves column 4L + c
// of four rows in 128-bit lane L of a vector; two rounds of lane shuffles
// then gather each column's four lanes.
HWY_INLINE void Transpose16(const float* b, int64_t ldb, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(b + i * ldb);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    const __m512d lo0 = _mm512_castps_pd(t[4 * g]), hi0 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d lo1 = _mm512_castps_pd(t[4 * g + 2]), hi1 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    _mm512_storeu_ps(dst + (c + 0) * ldd, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(dst + (c + 4) * ldd, _mm512_shuffle_f32x4(x0, y0, 0xDD));
    _mm512_storeu_ps(dst + (c + 8) * ldd, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(dst + (c + 12) * ldd, _mm512_shuffle_f32x4(x1, y1, 0xDD));
  }
}
#endif

// dst[p * n + j] = b[j * ldb + p]: on AVX-512 by 16 x 16 squares in
// registers, the ragged edges (and other targets) element by element,
// sixteen rows of B at a time so that each row of dst is written sixteen
// values at a stretch.
void TransposeImpl(const float* b, int64_t ldb, int64_t n, int64_t k, float* dst) {
  int64_t n16 = 0, k16 = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  n16 = n / 16 * 16, k16 = k / 16 * 16;
  for (int64_t j0 = 0; j0 < n16; j0 += 16)
    for (int64_t p0 = 0; p0 < k16; p0 += 16)
      Transpose16(b + j0 * ldb + p0, ldb, dst + p0 * n + j0, n);
#endif
  constexpr int64_t kRowsAtOnce = 16;
  for (int64_t j0 = 0; j0 < n; j0 += kRowsAtOnce) {
    const int64_t j1 = std::min(n, j0 + kRowsAtOnce);
    // Rows below n16 are done up to column k16.
    for (int64_t p = j0 < n16 ? k16 : 0; p < k; ++p)
      for (int64_t j = j0; j < j1; ++j) dst[p * n + j] = b[j * ldb + p];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

HWY_EXPORT(GemmImpl);
HWY_EXPORT(TransposeImpl);

void gemm(int64_t m, int64_t n, int64_t k, float alpha, Strided a, const float* b, int64_t ldb,
          bool accumulate, float* c, int64_t ldc, LineRuns prefetch) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmImpl)(m, n, k, alpha, a, b, ldb, accumulate, c, ldc, prefetch);
}

void transpose(const float* b, int64_t ldb, int64_t n, int64_t k, float* dst) {
  if (n <= 0 || k <= 0) return;
  HWY_DYNAMIC_DISPATCH(TransposeImpl)(b, ldb, n, k, dst);
}

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
