#include "cpu/simd/bf16_products.hpp"

#include <algorithm>

#include "core/feature_map.hpp"
#include "cpu/simd/elu1_avx512.hpp"
#include "cpu/simd/isa.hpp"
#include "cpu/simd/prefetch.hpp"
#include "cpu/simd/row_tiles.hpp"
#include "mhla/bfloat16.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MHLA_BF16_PRODUCTS 1
// The products' functions are compiled for AVX512-BF16 whatever the build's
// baseline, and run only after bf16_products_available() has seen it.
#define MHLA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define MHLA_BF16_INLINE MHLA_BF16_TARGET __attribute__((always_inline)) inline
#endif

namespace mhla::cpu::simd {

#ifdef MHLA_BF16_PRODUCTS
namespace {

// A register tile of C as in block_gemm.cpp: kRows rows by V vectors of 16
// floats; per pair of steps of the inner dimension it loads V vectors of B's
// pairs, broadcasts a pair of A per row, and issues kRows * V dot products.
constexpr int kRows = 6;
constexpr int kMaxVectors = 4;
constexpr int64_t kLanes = 16;

struct Operands {
  int64_t pairs;
  PairStrided a;
  const uint32_t* b;
  int64_t ldb;
  float* c;  // float results, or with `halves` bfloat16 ones into halves of words
  int64_t ldc;
  uint32_t* halves = nullptr;
  int shift = 0;                    // 0: the low halves, 16: the high ones
  __mmask32 pattern = 0x55555555u;  // the 16-bit lanes each word store writes
};

template <int R, int V, bool kMasked>
MHLA_BF16_INLINE void Tile(const Operands& o, int64_t i0, int64_t j0, __mmask16 tail,
                           PrefetchCursor& prefetch) {
  __m512 acc[R][V];
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();

  const uint32_t* a = o.a.data + i0 * o.a.row;
  const uint32_t* b = o.b + j0;
  for (int64_t p = 0; p < o.pairs; ++p, a += o.a.col, b += o.ldb) {
    prefetch.Next();
    __m512i bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = (kMasked && v == V - 1) ? _mm512_maskz_loadu_epi32(tail, b + v * kLanes)
                                      : _mm512_loadu_si512(b + v * kLanes);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512i ar = _mm512_set1_epi32(int(a[r * o.a.row]));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)ar, (__m512bh)bv[v]);
    }
  }
  if (o.halves) {
    // Rounded to bfloat16, each in its half of a word: the other half is
    // left as it is (or, with an all-ones pattern, zeroed).
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      uint32_t* c = o.halves + (i0 + r) * o.ldc + j0;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const __m512i words =
            _mm512_sll_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(acc[r][v])),
                             _mm_cvtsi32_si128(o.shift));
        // Two mask bits per word: lane w's two 16-bit halves.
        const __mmask32 lanes = (kMasked && v == V - 1)
                                    ? __mmask32((1ull << (2 * __builtin_popcount(tail))) - 1u)
                                    : __mmask32(0xFFFFFFFFu);
        _mm512_mask_storeu_epi16(c + v * kLanes, lanes & o.pattern, words);
      }
    }
    return;
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* c = o.c + (i0 + r) * o.ldc + j0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      if (kMasked && v == V - 1)
        _mm512_mask_storeu_ps(c + v * kLanes, tail, acc[r][v]);
      else
        _mm512_storeu_ps(c + v * kLanes, acc[r][v]);
    }
  }
}

template <int R>
MHLA_BF16_INLINE void TileOfWidth(const Operands& o, int64_t i0, int64_t j0, int vectors,
                                  __mmask16 tail, bool masked, PrefetchCursor& pf) {
  switch (vectors) {
    case 1:
      return masked ? Tile<R, 1, true>(o, i0, j0, tail, pf)
                    : Tile<R, 1, false>(o, i0, j0, tail, pf);
    case 2:
      return masked ? Tile<R, 2, true>(o, i0, j0, tail, pf)
                    : Tile<R, 2, false>(o, i0, j0, tail, pf);
    case 3:
      return masked ? Tile<R, 3, true>(o, i0, j0, tail, pf)
                    : Tile<R, 3, false>(o, i0, j0, tail, pf);
    default:
      return masked ? Tile<R, 4, true>(o, i0, j0, tail, pf)
                    : Tile<R, 4, false>(o, i0, j0, tail, pf);
  }
}

// Flattened: the row tiles' calls through for_each_row_tile inline here.
MHLA_BF16_TARGET __attribute__((flatten)) void gemm_bf16_avx512(int64_t m, int64_t n,
                                                                const Operands& o,
                                                                LineRuns prefetch) {
  constexpr int64_t panel = kMaxVectors * kLanes;
  PrefetchCursor pf(prefetch);
  // Column panels outside, row tiles inside, as in block_gemm.cpp.
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t cols = std::min(panel, n - j0);
    const int vectors = int((cols + kLanes - 1) / kLanes);
    const int64_t last = cols - (vectors - 1) * kLanes;
    const __mmask16 tail = __mmask16((1u << last) - 1u);
    const bool masked = last != kLanes;
    for_each_row_tile<kRows>(m, [&](auto rows, int64_t i0) MHLA_BF16_TARGET {
      TileOfWidth<decltype(rows)::value>(o, i0, j0, vectors, tail, masked, pf);
    });
  }
}

// 16 floats from p (the first n of them when n < 16, the rest zero),
// rounded to bfloat16 (nearest, ties to even; NaN stays NaN; float
// subnormals, below 1.2e-38, flush to zero).
MHLA_BF16_INLINE __m256i RoundedVector(const float* p, int64_t n) {
  const __m512 x =
      n >= kLanes ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p);
  return (__m256i)_mm512_cvtneps_pbh(x);
}

MHLA_BF16_TARGET void pack_row_pairs_avx512(const float* src, int64_t lds, int64_t rows,
                                            int64_t width, uint32_t* dst, int64_t ldd) {
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const float* even = src + 2 * p * lds;
    const float* odd = 2 * p + 1 < rows ? even + lds : nullptr;
    uint32_t* out = dst + p * ldd;
    for (int64_t j = 0; j < width; j += kLanes) {
      const int64_t n = std::min(kLanes, width - j);
      const __m512i low = _mm512_cvtepu16_epi32(RoundedVector(even + j, n));
      const __m512i high =
          odd ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(RoundedVector(odd + j, n)), 16)
              : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + j, __mmask16((1u << n) - 1u), _mm512_or_si512(low, high));
    }
  }
}

MHLA_BF16_TARGET void pack_column_pairs_avx512(const float* src, int64_t lds, int64_t rows,
                                               int64_t width, uint32_t* dst, int64_t ldd) {
  // A row's pairs are its bfloat16 values in order (little-endian words),
  // an odd width padded with a zero.
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * lds;
    uint16_t* out = reinterpret_cast<uint16_t*>(dst + r * ldd);
    for (int64_t j = 0; j < width; j += kLanes) {
      const int64_t n = std::min(kLanes, width - j);
      _mm256_mask_storeu_epi16(out + j, __mmask16((1u << n) - 1u), RoundedVector(x + j, n));
    }
    if (width % 2) out[width] = 0;
  }
}

// Transposes 16 rows of 16 words: row i of w[i] goes to column i (w[j] then
// holds what was column j). Pairs, quads, then 128-bit lanes swapped.
MHLA_BF16_INLINE void Transpose16(__m512i w[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(w[i], w[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(w[i], w[i + 1]);
  }
  // Group g (rows 4g..4g+3): u[4g + k]'s lane L holds column 4L + k of them.
  __m512i u[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512i* x = t + 4 * g;
    u[4 * g + 0] = _mm512_unpacklo_epi64(x[0], x[2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(x[0], x[2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(x[1], x[3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(x[1], x[3]);
  }
  // Column 4L + k: lane L of u[k], u[4 + k], u[8 + k], u[12 + k].
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i low01 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    const __m512i high01 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i low23 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i high23 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    w[k] = _mm512_shuffle_i32x4(low01, low23, 0x88);
    w[4 + k] = _mm512_shuffle_i32x4(low01, low23, 0xDD);
    w[8 + k] = _mm512_shuffle_i32x4(high01, high23, 0x88);
    w[12 + k] = _mm512_shuffle_i32x4(high01, high23, 0xDD);
  }
}

MHLA_BF16_TARGET void pack_transposed_pairs_avx512(const float* src, int64_t lds, int64_t rows,
                                                   int64_t width, uint32_t* dst, int64_t ldd) {
  // Blocks of 16 rows by 16 pairs: a row's 32 values rounded are its 16 pairs
  // in order, then the block is transposed in registers (four times as fast
  // as gathering each pair's two columns down the rows).
  const int64_t pairs = (width + 1) / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += kLanes) {
    const int64_t values = std::min(2 * kLanes, width - 2 * p0);
    const __mmask16 low = __mmask16((1u << std::min(kLanes, values)) - 1u);
    const __mmask16 high = __mmask16((1u << std::max<int64_t>(0, values - kLanes)) - 1u);
    const int64_t out_rows = std::min(kLanes, pairs - p0);
    for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
      const int64_t n = std::min(kLanes, rows - r0);
      __m512i w[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        if (i >= n) {
          w[i] = _mm512_setzero_si512();
          continue;
        }
        const float* x = src + (r0 + i) * lds + 2 * p0;
        const __m512 a = values == 2 * kLanes ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(low, x);
        const __m512 b = values == 2 * kLanes ? _mm512_loadu_ps(x + kLanes)
                                              : _mm512_maskz_loadu_ps(high, x + kLanes);
        w[i] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      }
      Transpose16(w);
      uint32_t* out = dst + p0 * ldd + r0;
      for (int64_t j = 0; j < out_rows; ++j) {
        if (n == kLanes)
          _mm512_storeu_si512(out + j * ldd, w[j]);
        else
          _mm512_mask_storeu_epi32(out + j * ldd, __mmask16((1u << n) - 1u), w[j]);
      }
    }
  }
}

// probe + x * 0 for the 16 bfloat16 x in b: x * 0 is NaN exactly when x is
// not finite. (A helper, not a lambda: lambdas do not take the target.)
MHLA_BF16_INLINE __m512 AddProbe(__m512 probe, __m256i b) {
  const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  return _mm512_add_ps(probe, _mm512_mul_ps(back, _mm512_setzero_ps()));
}

// phi on 16 floats, as core/feature_map.hpp defines it (NaN kept: vmaxps
// returns its second operand when either is NaN); elu + 1 in the form for
// values rounded to bfloat16 afterwards (elu1_avx512.hpp).
template <FeatureMap Phi>
MHLA_BF16_INLINE __m512 Feature(__m512 x) {
  if constexpr (Phi == FeatureMap::elu1) return elu1_avx512_for_bf16(x);
  if constexpr (Phi == FeatureMap::relu) return _mm512_max_ps(_mm512_setzero_ps(), x);
  return x;
}

template <FeatureMap Phi>
MHLA_BF16_TARGET void feature_rows_avx512(const bfloat16* src, int64_t ld_src, float* tile,
                                          int64_t rows, int64_t width, int64_t ld,
                                          uint16_t* rounded, int64_t ld_rounded) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(src + r * ld_src);
    // Beside the lines requested during the product before (RowLines), which
    // the shorter bfloat16 products leave less time to arrive (mhla_bench's
    // bfloat16 table).
    prefetch_ahead(src + r * ld_src, ld_src, width);
    float* y = tile + r * ld;
    uint16_t* z = rounded ? rounded + r * ld_rounded : nullptr;
    int64_t j = 0;
    // Whole vectors unmasked (masked stores cost more on Zen 5), then the tail.
    for (; j + kLanes <= width; j += kLanes) {
      const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + j)));
      const __m512 f = Feature<Phi>(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)));
      _mm512_storeu_ps(y + j, f);
      if (z) _mm256_storeu_si256((__m256i*)(z + j), (__m256i)_mm512_cvtneps_pbh(f));
    }
    if (j < width) {
      const __mmask16 mask = __mmask16((1u << (width - j)) - 1u);
      const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x + j));
      const __m512 f = Feature<Phi>(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)));
      _mm512_mask_storeu_ps(y + j, mask, f);
      if (z) _mm256_mask_storeu_epi16(z + j, mask, (__m256i)_mm512_cvtneps_pbh(f));
    }
    if (z && width % 2) z[width] = 0;
  }
}

// phi of up to 16 bfloat16 values at x (the first n; the other lanes zero).
template <FeatureMap Phi>
MHLA_BF16_INLINE __m512 FeatureVector(const uint16_t* x, int64_t n) {
  if (n >= kLanes) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)x));
    return Feature<Phi>(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)));
  }
  const __mmask16 mask = __mmask16((1u << n) - 1u);
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x));
  // phi(0) need not be 0 (elu + 1): the lanes past n stay out of the sums.
  return _mm512_maskz_mov_ps(mask, Feature<Phi>(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16))));
}

// The low halves of 16 words: f rounded to bfloat16.
MHLA_BF16_INLINE __m512i LowHalves(__m512 f) {
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(f));
}

// The halves (a 16-bit lane mask) of the first n of 16 words at dst.
MHLA_BF16_INLINE void StoreHalves(uint32_t* dst, int64_t n, __m512i words, __mmask32 halves) {
  _mm512_mask_storeu_epi16(dst, __mmask32((1ull << (2 * n)) - 1u) & halves, words);
}

// One vector of a row's features (the first n): added to acc, and stored at
// `tile` when there is one.
template <FeatureMap Phi>
MHLA_BF16_INLINE __m512 RowFeatures(const uint16_t* x, int64_t n, __m512& acc, float* tile) {
  const __m512 f = FeatureVector<Phi>(x, n);
  acc = _mm512_add_ps(acc, f);
  if (tile) {
    if (n == kLanes)
      _mm512_storeu_ps(tile, f);
    else
      _mm512_mask_storeu_ps(tile, __mmask16((1u << n) - 1u), f);
  }
  return f;
}

// feature_row_pairs on columns j.. of V vectors (the last `last` wide), the
// vectors' loops unrolled so that their sums stay in registers, and each pair
// of rows rounded by one instruction and interleaved by one permute. (With a
// run-time count of vectors and each row rounded and widened on its own, the
// summary phase in mhla_bench's bfloat16 table was slower.)
template <FeatureMap Phi, int V>
MHLA_BF16_INLINE void FeatureRowPairsChunk(const uint16_t* bits, int64_t ld_src, int64_t first,
                                           int64_t rows, int64_t width, int64_t j, int64_t last,
                                           uint32_t* dst, int64_t ldd, float* sums, float* tile,
                                           int64_t ld_tile) {
  int64_t n[V];
  __m512 acc[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    n[v] = v == V - 1 ? last : kLanes;
    acc[v] = sums ? _mm512_maskz_loadu_ps(__mmask16((1u << n[v]) - 1u), sums + j + v * kLanes)
                  : _mm512_setzero_ps();
  }
  // Value k of the low row and of the high row to halves 0 and 1 of word k.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  int64_t r = 0;
  // A run that starts at an odd row completes the pair its row belongs to.
  if (first % 2 && rows > 0) {
    uint32_t* out = dst + (first / 2) * ldd + j;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const int64_t c = j + v * kLanes;
      const __m512 f = RowFeatures<Phi>(bits + c, n[v], acc[v], tile ? tile + c : nullptr);
      StoreHalves(out + v * kLanes, n[v], _mm512_slli_epi32(LowHalves(f), 16), 0xAAAAAAAAu);
    }
    r = 1;
  }
  for (; r < rows; r += 2) {
    if (j == 0) {
      prefetch_ahead(bits + r * ld_src, ld_src, width);
      prefetch_ahead(bits + (r + 1) * ld_src, ld_src, width);
    }
    // An odd last row is paired with zero (a later run's first row may fill it).
    const bool pair = r + 1 < rows;
    uint32_t* out = dst + ((first + r) / 2) * ldd + j;
    float* tile_row = tile ? tile + r * ld_tile + j : nullptr;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __m512 f = RowFeatures<Phi>(bits + r * ld_src + j + v * kLanes, n[v], acc[v],
                                        tile_row ? tile_row + v * kLanes : nullptr);
      const __m512 g =
          pair ? RowFeatures<Phi>(bits + (r + 1) * ld_src + j + v * kLanes, n[v], acc[v],
                                  tile_row ? tile_row + ld_tile + v * kLanes : nullptr)
               : _mm512_setzero_ps();
      // Both rows rounded in one instruction (f's in the low 16 values), then
      // interleaved into words.
      const __m512i words =
          _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(g, f));
      if (n[v] == kLanes)
        _mm512_storeu_si512(out + v * kLanes, words);
      else
        StoreHalves(out + v * kLanes, n[v], words, 0xFFFFFFFFu);
    }
  }
  if (!sums) return;
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v)
    _mm512_mask_storeu_ps(sums + j + v * kLanes, __mmask16((1u << n[v]) - 1u), acc[v]);
}

template <FeatureMap Phi>
MHLA_BF16_TARGET void feature_row_pairs_avx512(const bfloat16* src, int64_t ld_src, int64_t first,
                                               int64_t rows, int64_t width, uint32_t* dst,
                                               int64_t ldd, float* sums, float* tile,
                                               int64_t ld_tile) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  // Four vectors of columns at a time, their sums in registers (the float
  // tile's column sums, added in memory row after row, waited on their own
  // stores: a tenth of the summary phase).
  for (int64_t j = 0; j < width; j += kMaxVectors * kLanes) {
    const int64_t cols = std::min(kMaxVectors * kLanes, width - j);
    const int vectors = int((cols + kLanes - 1) / kLanes);
    const int64_t last = cols - (vectors - 1) * kLanes;
    switch (vectors) {
      case 1:
        FeatureRowPairsChunk<Phi, 1>(bits, ld_src, first, rows, width, j, last, dst, ldd, sums,
                                     tile, ld_tile);
        break;
      case 2:
        FeatureRowPairsChunk<Phi, 2>(bits, ld_src, first, rows, width, j, last, dst, ldd, sums,
                                     tile, ld_tile);
        break;
      case 3:
        FeatureRowPairsChunk<Phi, 3>(bits, ld_src, first, rows, width, j, last, dst, ldd, sums,
                                     tile, ld_tile);
        break;
      default:
        FeatureRowPairsChunk<Phi, 4>(bits, ld_src, first, rows, width, j, last, dst, ldd, sums,
                                     tile, ld_tile);
        break;
    }
  }
}

MHLA_BF16_TARGET void scaled_pairs_avx512(const bfloat16* src, int64_t n, float factor,
                                          uint32_t* columns, uint32_t* rows, int half,
                                          float* wide) {
  const __m512 f = _mm512_set1_ps(factor);
  const uint16_t* x = reinterpret_cast<const uint16_t*>(src);
  uint16_t* in_order = reinterpret_cast<uint16_t*>(columns);
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t m = std::min(kLanes, n - j);
    const __mmask16 mask = __mmask16((1u << m) - 1u);
    const __m256i bits = m == kLanes ? _mm256_loadu_si256((const __m256i*)(x + j))
                                     : _mm256_maskz_loadu_epi16(mask, x + j);
    const __m512 value =
        _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)), f);
    if (wide) _mm512_mask_storeu_ps(wide + j, mask, value);
    const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(value);
    _mm256_mask_storeu_epi16(in_order + j, mask, rounded);
    const __m512i words = _mm512_cvtepu16_epi32(rounded);
    if (half)
      StoreHalves(rows + j, m, _mm512_slli_epi32(words, 16), 0xAAAAAAAAu);
    else if (m == kLanes)
      _mm512_storeu_si512(rows + j, words);
    else
      _mm512_mask_storeu_epi32(rows + j, mask, words);
  }
  if (n % 2) in_order[n] = 0;
}

// A row of n bfloat16 values into out, 16 at a time from vector(j, mask,
// whole) (whole: all 16 lanes, else those in mask), each probed: with
// `stream`, a row of whole cache lines starting on a line goes out 32 values
// a store, bypassing the cache. (A functor, not a lambda: lambdas do not take
// the target.)
template <typename Vector>
MHLA_BF16_INLINE void NarrowedRow(uint16_t* out, int64_t n, bool stream, const Vector& vector,
                                  __m512& probe) {
  constexpr int64_t kLine = 64;
  if (stream && reinterpret_cast<uintptr_t>(out) % kLine == 0 && (2 * n) % kLine == 0) {
    for (int64_t j = 0; j < n; j += 2 * kLanes) {
      const __m256i low = vector(j, 0, true), high = vector(j + kLanes, 0, true);
      _mm512_stream_si512((__m512i*)(out + j),
                          _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1));
      probe = AddProbe(AddProbe(probe, low), high);
    }
    return;
  }
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t m = std::min(kLanes, n - j);
    const __mmask16 mask = __mmask16((1u << m) - 1u);
    const __m256i b = vector(j, mask, m == kLanes);
    if (m == kLanes)
      _mm256_storeu_si256((__m256i*)(out + j), b);
    else
      _mm256_mask_storeu_epi16(out + j, mask, b);
    probe = AddProbe(probe, b);
  }
}

// Values j.. of a row of src times f, rounded (narrow_rows).
struct ScaledVector {
  const float* src;
  __m512 f;
  MHLA_BF16_INLINE __m256i operator()(int64_t j, __mmask16 mask, bool whole) const {
    const __m512 x = whole ? _mm512_loadu_ps(src + j) : _mm512_maskz_loadu_ps(mask, src + j);
    return (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(x, f));
  }
};

MHLA_BF16_TARGET float narrow_rows_avx512(const float* src, int64_t ld, int64_t rows, int64_t n,
                                          const float* factors, bfloat16* const* dst, bool stream) {
  __m512 probe = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r)
    NarrowedRow(reinterpret_cast<uint16_t*>(dst[r]), n, stream,
                ScaledVector{src + r * ld, _mm512_set1_ps(factors[r])}, probe);
  return _mm512_reduce_add_ps(probe);
}

// phi'(x) from y = phi(x) on 16 floats, as derivative_from_feature in
// core/feature_map.hpp: min(y, 1) keeps a NaN y as vminps keeps its second
// operand; relu's [y > 0] is 0 for NaN.
template <FeatureMap Phi>
MHLA_BF16_INLINE __m512 Derivative(__m512 y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  if constexpr (Phi == FeatureMap::elu1) return _mm512_min_ps(one, y);
  if constexpr (Phi == FeatureMap::relu)
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), one);
  return one;
}

// Values j.. of a row narrowed by narrow_gradients: the row's features,
// gradient, bias (or none) and old values, each pointer offset only where it
// is read.
template <FeatureMap Phi, bool kAccumulate>
struct GradientVector {
  const float* features;
  const float* grad;
  const float* bias;
  const float* bias_scale;
  const uint16_t* old;
  MHLA_BF16_INLINE __m256i operator()(int64_t j, __mmask16 mask, bool whole) const {
    __m512 g = whole ? _mm512_loadu_ps(grad + j) : _mm512_maskz_loadu_ps(mask, grad + j);
    if (bias) {
      const __m512 b = whole ? _mm512_loadu_ps(bias + j) : _mm512_maskz_loadu_ps(mask, bias + j);
      g = bias_scale ? _mm512_fmadd_ps(_mm512_set1_ps(*bias_scale), b, g) : _mm512_add_ps(g, b);
    }
    if constexpr (kAccumulate) {
      const __m256i bits = whole ? _mm256_loadu_si256((const __m256i*)(old + j))
                                 : _mm256_maskz_loadu_epi16(mask, old + j);
      g = _mm512_add_ps(g, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
    }
    if constexpr (Phi != FeatureMap::identity) {
      const __m512 y =
          whole ? _mm512_loadu_ps(features + j) : _mm512_maskz_loadu_ps(mask, features + j);
      g = _mm512_mul_ps(Derivative<Phi>(y), g);
    }
    return (__m256i)_mm512_cvtneps_pbh(g);
  }
};

template <FeatureMap Phi, bool kAccumulate>
MHLA_BF16_TARGET float narrow_gradients_avx512(const float* features, int64_t ld_features,
                                               const float* grad, int64_t ld_grad,
                                               RowBias<float> bias, int64_t rows, int64_t n,
                                               bfloat16* const* dst, bool stream) {
  __m512 probe = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* out = reinterpret_cast<uint16_t*>(dst[r]);
    // (The identity reads no features, which may then be null.)
    const GradientVector<Phi, kAccumulate> vector{
        Phi == FeatureMap::identity ? nullptr : features + r * ld_features, grad + r * ld_grad,
        bias.values, bias.scales ? bias.scales + r : nullptr, out};
    // Never streamed when accumulating: the old values are read.
    NarrowedRow(out, n, stream && !kAccumulate, vector, probe);
  }
  return _mm512_reduce_add_ps(probe);
}

MHLA_BF16_TARGET void row_dots_avx512(const float* a, const float* b, int64_t ld, int64_t rows,
                                      int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a + r * ld;
    const float* y = b + r * ld;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += kLanes) {
      const __mmask16 mask = __mmask16((1u << std::min(kLanes, n - j)) - 1u);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + j), _mm512_maskz_loadu_ps(mask, y + j),
                            acc);
    }
    out[r] = _mm512_reduce_add_ps(acc);
  }
}

MHLA_BF16_TARGET void weighted_column_sums_avx512(const float* a, int64_t ld, int64_t rows,
                                                  int64_t n, const float* weights, float* out) {
  // Four vectors of columns at a time, summed in registers down the rows: a
  // fixed count of vectors, those past n masked off entirely, so that the
  // unrolled loops keep the sums in registers.
  for (int64_t j = 0; j < n; j += kMaxVectors * kLanes) {
    __mmask16 mask[kMaxVectors];
    __m512 acc[kMaxVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kMaxVectors; ++v) {
      const int64_t m = std::clamp<int64_t>(n - j - v * kLanes, 0, kLanes);
      mask[v] = __mmask16((1u << m) - 1u);
      acc[v] = _mm512_setzero_ps();
    }
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 w = _mm512_set1_ps(weights[r]);
#pragma GCC unroll 4
      for (int v = 0; v < kMaxVectors; ++v)
        acc[v] =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[v], a + r * ld + j + v * kLanes), w, acc[v]);
    }
#pragma GCC unroll 4
    for (int v = 0; v < kMaxVectors; ++v)
      _mm512_mask_storeu_ps(out + j + v * kLanes, mask[v], acc[v]);
  }
}

}  // namespace

bool bf16_products_available() {
  static const bool cpu_has_it = __builtin_cpu_supports("avx512bf16") &&
                                 __builtin_cpu_supports("avx512bw") &&
                                 __builtin_cpu_supports("avx512vl");
  // Tests pin lesser targets to run the other paths: the bfloat16 products go
  // with AVX-512.
  return cpu_has_it && active_target_is_avx512();
}

void gemm_bf16(int64_t m, int64_t n, int64_t pairs, PairStrided a, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc, LineRuns prefetch) {
  if (m <= 0 || n <= 0) return;
  gemm_bf16_avx512(m, n, Operands{pairs, a, b, ldb, c, ldc}, prefetch);
}

void gemm_bf16_halves(int64_t m, int64_t n, int64_t pairs, PairStrided a, const uint32_t* b,
                      int64_t ldb, uint32_t* c, int64_t ldc, int half, bool zero_other,
                      LineRuns prefetch) {
  if (m <= 0 || n <= 0) return;
  Operands o{pairs, a, b, ldb, nullptr, ldc, c, half ? 16 : 0};
  o.pattern = zero_other ? 0xFFFFFFFFu : half ? 0xAAAAAAAAu : 0x55555555u;
  gemm_bf16_avx512(m, n, o, prefetch);
}

void pack_row_pairs(const float* src, int64_t lds, int64_t rows, int64_t width, uint32_t* dst,
                    int64_t ldd) {
  pack_row_pairs_avx512(src, lds, rows, width, dst, ldd);
}

void pack_column_pairs(const float* src, int64_t lds, int64_t rows, int64_t width, uint32_t* dst,
                       int64_t ldd) {
  pack_column_pairs_avx512(src, lds, rows, width, dst, ldd);
}

void pack_transposed_pairs(const float* src, int64_t lds, int64_t rows, int64_t width,
                           uint32_t* dst, int64_t ldd) {
  pack_transposed_pairs_avx512(src, lds, rows, width, dst, ldd);
}

float narrow_rows(const float* src, int64_t ld, int64_t rows, int64_t n, const float* factors,
                  bfloat16* const* dst, bool stream) {
  return narrow_rows_avx512(src, ld, rows, n, factors, dst, stream);
}

void scaled_pairs(const bfloat16* src, int64_t n, float factor, uint32_t* columns, uint32_t* rows,
                  int half, float* wide) {
  scaled_pairs_avx512(src, n, factor, columns, rows, half, wide);
}

void row_dots(const float* a, const float* b, int64_t ld, int64_t rows, int64_t n, float* out) {
  row_dots_avx512(a, b, ld, rows, n, out);
}

void weighted_column_sums(const float* a, int64_t ld, int64_t rows, int64_t n, const float* weights,
                          float* out) {
  weighted_column_sums_avx512(a, ld, rows, n, weights, out);
}

float narrow_gradients(FeatureMap phi, const float* features, int64_t ld_features,
                       const float* grad, int64_t ld_grad, RowBias<float> bias, bool accumulate,
                       int64_t rows, int64_t n, bfloat16* const* dst, bool stream) {
  return mhla::detail::dispatch_feature(phi, [&]<FeatureMap Phi>() {
    return accumulate ? narrow_gradients_avx512<Phi, true>(features, ld_features, grad, ld_grad,
                                                           bias, rows, n, dst, stream)
                      : narrow_gradients_avx512<Phi, false>(features, ld_features, grad, ld_grad,
                                                            bias, rows, n, dst, stream);
  });
}

void feature_row_pairs(FeatureMap phi, const bfloat16* src, int64_t ld_src, int64_t first,
                       int64_t rows, int64_t width, uint32_t* pairs, int64_t ldd, float* sums,
                       float* tile, int64_t ld_tile) {
  mhla::detail::dispatch_feature(phi, [&]<FeatureMap Phi>() {
    feature_row_pairs_avx512<Phi>(src, ld_src, first, rows, width, pairs, ldd, sums, tile, ld_tile);
  });
}

void feature_rows(FeatureMap phi, const bfloat16* src, int64_t ld_src, float* tile, int64_t rows,
                  int64_t width, int64_t ld, uint32_t* pairs, int64_t ld_pairs) {
  mhla::detail::dispatch_feature(phi, [&]<FeatureMap Phi>() {
    feature_rows_avx512<Phi>(src, ld_src, tile, rows, width, ld, reinterpret_cast<uint16_t*>(pairs),
                             2 * ld_pairs);
  });
}
#else
bool bf16_products_available() { return false; }
void gemm_bf16(int64_t, int64_t, int64_t, PairStrided, const uint32_t*, int64_t, float*, int64_t,
               LineRuns) {}
void gemm_bf16_halves(int64_t, int64_t, int64_t, PairStrided, const uint32_t*, int64_t, uint32_t*,
                      int64_t, int, bool, LineRuns) {}
void pack_row_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_column_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_transposed_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void row_dots(const float*, const float*, int64_t, int64_t, int64_t, float*) {}
void weighted_column_sums(const float*, int64_t, int64_t, int64_t, const float*, float*) {}
float narrow_gradients(FeatureMap, const float*, int64_t, const float*, int64_t, RowBias<float>,
                       bool, int64_t, int64_t, bfloat16* const*, bool) {
  return 0;
}
void scaled_pairs(const bfloat16*, int64_t, float, uint32_t*, uint32_t*, int, float*) {}
float narrow_rows(const float*, int64_t, int64_t, int64_t, const float*, bfloat16* const*, bool) {
  return 0;
}
void feature_row_pairs(FeatureMap, const bfloat16*, int64_t, int64_t, int64_t, int64_t, uint32_t*,
                       int64_t, float*, float*, int64_t) {}
void feature_rows(FeatureMap, const bfloat16*, int64_t, float*, int64_t, int64_t, int64_t,
                  uint32_t*, int64_t) {}
#endif

}  // namespace mhla::cpu::simd
