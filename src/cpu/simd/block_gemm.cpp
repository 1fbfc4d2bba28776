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
// One requested line (LineRuns) every this many steps of the inner
// dimension, so that the requests never pile up beyond the miss buffers.
constexpr int64_t kStepsPerPrefetch = 1;

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

// Walks the lines of a LineRuns, one request at a time.
class PrefetchCursor {
 public:
  explicit PrefetchCursor(LineRuns runs) : runs_(runs) {}

  HWY_INLINE void Next() {
    if (run_ >= runs_.count) return;
    const LineRuns::Run& r = runs_.runs[run_];
    const char* line = r.first + row_ * r.stride + line_ * 64;
    if (r.write)
      __builtin_prefetch(line, 1, 3);
    else
      __builtin_prefetch(line, 0, 3);
    if (++line_ < r.lines) return;
    line_ = 0;
    if (++row_ < r.rows) return;
    row_ = 0;
    ++run_;
  }

 private:
  LineRuns runs_;
  int64_t run_ = 0, row_ = 0, line_ = 0;
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
    if (p % kStepsPerPrefetch == 0) prefetch.Next();
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
      return masked ? Tile<R, 1, true>(o, i0, j0, tail, pf) : Tile<R, 1, false>(o, i0, j0, tail, pf);
    case 2:
      return masked ? Tile<R, 2, true>(o, i0, j0, tail, pf) : Tile<R, 2, false>(o, i0, j0, tail, pf);
    default:
      if constexpr (kMaxVectors >= 4) {
        if (vectors == 3)
          return masked ? Tile<R, 3, true>(o, i0, j0, tail, pf) : Tile<R, 3, false>(o, i0, j0, tail, pf);
        return masked ? Tile<R, 4, true>(o, i0, j0, tail, pf) : Tile<R, 4, false>(o, i0, j0, tail, pf);
      }
  }
}

void GemmImpl(int64_t m, int64_t n, int64_t k, float alpha, Strided a, const float* b, int64_t ldb,
              bool accumulate, float* c, int64_t ldc, LineRuns prefetch) {
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
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      switch (std::min<int64_t>(kRows, m - i0)) {
        case 1:
          TileOfWidth<1>(o, i0, j0, vectors, tail, masked, pf);
          break;
        case 2:
          TileOfWidth<2>(o, i0, j0, vectors, tail, masked, pf);
          break;
        case 3:
          TileOfWidth<3>(o, i0, j0, vectors, tail, masked, pf);
          break;
        case 4:
          TileOfWidth<4>(o, i0, j0, vectors, tail, masked, pf);
          break;
        case 5:
          TileOfWidth<5>(o, i0, j0, vectors, tail, masked, pf);
          break;
        default:
          TileOfWidth<6>(o, i0, j0, vectors, tail, masked, pf);
          break;
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

HWY_EXPORT(GemmImpl);

void gemm(int64_t m, int64_t n, int64_t k, float alpha, Strided a, const float* b, int64_t ldb,
          bool accumulate, float* c, int64_t ldc, LineRuns prefetch) {
  if (m <= 0 || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmImpl)(m, n, k, alpha, a, b, ldb, accumulate, c, ldc, prefetch);
}

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
