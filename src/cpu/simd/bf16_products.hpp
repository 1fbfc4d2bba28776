#pragma once
// Block products with bfloat16 operands and float32 sums, on AVX512-BF16's
// dot-product instruction (VDPBF16PS: each float lane adds the two products
// of a pair of bfloat16s, nearly twice the multiply-adds per instruction of
// float FMA). The operands come as pairs along the inner dimension, one
// 32-bit word per pair: the bfloat16 of the even step in the low half, of the
// odd step in the high half. Used by the bfloat16 operator when this CPU has
// the instruction and the kernels run on AVX-512 (cpu/simd/isa.hpp); the
// operator otherwise computes in float (widening its inputs).
#include <cstdint>

#include "cpu/row_bias.hpp"
#include "cpu/simd/block_gemm.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/options.hpp"

namespace mhla::cpu::simd {

// Whether the products below may run: the CPU has AVX512-BF16 and the kernels
// are not pinned below AVX-512.
bool bf16_products_available();

// A matrix of pairs read in place: word (i, p), holding A[i, 2p] and
// A[i, 2p + 1], at data[i * row + p * col].
struct PairStrided {
  const uint32_t* data;
  int64_t row, col;
};

// The row stride, in words, to pack a B of `width` pairs a row with: the
// width, plus 16 words when it is a multiple of 256 (1 KiB), so that the rows
// of the 64 columns the kernel reads at a time do not share the same few L1
// sets (rows 4 KiB apart made the product slower).
inline int64_t padded_pair_stride(int64_t width) { return width % 256 == 0 ? width + 16 : width; }

// C[m, n] = A[m, 2 pairs] B[2 pairs, n] in float32, with B's pairs row-major
// ([pairs, n] words, ldb apart) and C row-major (ldc). Each element is summed
// in the same order on every call. Only when bf16_products_available().
void gemm_bf16(int64_t m, int64_t n, int64_t pairs, PairStrided a, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc, LineRuns prefetch = {});

// gemm_bf16 with C rounded to bfloat16 into one half of 32-bit words (half 0:
// the low halves, 1: the high ones), leaving the other half as it is, or with
// `zero_other` zeroing it: C as pairs of rows for a product that reads it as
// B, written one row of each pair at a time (the dense mix's summaries).
void gemm_bf16_halves(int64_t m, int64_t n, int64_t pairs, PairStrided a, const uint32_t* b,
                      int64_t ldb, uint32_t* c, int64_t ldc, int half, bool zero_other,
                      LineRuns prefetch = {});

// The helpers below round float to bfloat16 as the instruction set does:
// nearest, ties to even, NaN stays NaN, float subnormals (below 1.2e-38)
// flush to zero. Like the products, only when bf16_products_available().

// The pairs of rows of a float matrix, rounded to bfloat16: dst[p * ldd + j] = (src[2p, j], src[2p
// + 1, j]) for p < (rows + 1) / 2 and j < width; an odd last row is paired with zero. As B, or as
// A^T.
void pack_row_pairs(const float* src, int64_t lds, int64_t rows, int64_t width, uint32_t* dst,
                    int64_t ldd);

// The pairs of columns: dst[r * ldd + p] = (src[r, 2p], src[r, 2p + 1]) for
// r < rows and p < (width + 1) / 2; an odd last column is paired with zero.
// As A. (Each row's pairs are its bfloat16 values in order.)
void pack_column_pairs(const float* src, int64_t lds, int64_t rows, int64_t width, uint32_t* dst,
                       int64_t ldd);

// The pairs of columns, transposed: dst[p * ldd + r] = (src[r, 2p],
// src[r, 2p + 1]) for p < (width + 1) / 2 and r < rows; an odd last column is
// paired with zero. As B where the product reads a row-major matrix as B^T.
void pack_transposed_pairs(const float* src, int64_t lds, int64_t rows, int64_t width,
                           uint32_t* dst, int64_t ldd);

// tile[r * ld + c] = phi(src[r * ld_src + c]) for r < rows, c < width, from
// bfloat16 rows (widened exactly; elu+1 in the shorter form for bfloat16
// features, cpu/simd/elu1_avx512.hpp); with `pairs`, also phi's values
// rounded to bfloat16 as pack_column_pairs writes them (row r at
// pairs + r * ld_pairs).
void feature_rows(FeatureMap phi, const bfloat16* src, int64_t ld_src, float* tile, int64_t rows,
                  int64_t width, int64_t ld, uint32_t* pairs = nullptr, int64_t ld_pairs = 0);

// dst[r][j] = bfloat16(src[r * ld + j] * factors[r]) for r < rows, j < n;
// returns the sum of every dst[r][j] * 0, NaN exactly when one is not finite.
// With `stream`, a row of whole cache lines starting on a line is written with
// non-temporal stores (the caller then orders them with finish_streaming(),
// cpu/simd/stream_rows.hpp).
float narrow_rows(const float* src, int64_t ld, int64_t rows, int64_t n, const float* factors,
                  bfloat16* const* dst, bool stream);

// A bfloat16 row x (n values) times `factor`, rounded to bfloat16 in the two
// pair forms of a row-major matrix it is a row of: `columns` gets the row as
// pack_column_pairs writes it (its values in order, an odd n padded with
// zero), and half `half` of each of the n words at `rows` the values as
// pack_row_pairs writes them (half 0 writes whole words, the high halves
// zero: the pair of an odd last row). With `wide`, the float products too.
// Each value is rounded from x[j] * factor in float, as the packings would
// round the float row.
void scaled_pairs(const bfloat16* x, int64_t n, float factor, uint32_t* columns, uint32_t* rows,
                  int half, float* wide = nullptr);

// dst[r][j] = bfloat16(phi'(x) (grad[r, j] + b[r, j])) for r < rows, j < n,
// or accumulating bfloat16(phi'(x) (grad[r, j] + b[r, j] + dst[r][j])), with
// b the bias (its scaled values as one multiply-add), and phi'(x) formed from
// features[r, j] = phi(x) as derivative_from_feature (core/feature_map.hpp)
// forms it (identity: features unread). Rounds and probes as narrow_rows
// does, and streams as it does (never when accumulating).
float narrow_gradients(FeatureMap phi, const float* features, int64_t ld_features,
                       const float* grad, int64_t ld_grad, RowBias<float> bias, bool accumulate,
                       int64_t rows, int64_t n, bfloat16* const* dst, bool stream);

// Float helpers of the bfloat16 backward (AVX-512, so also only when
// bf16_products_available()):
// out[r] = sum_j a[r, j] b[r, j] for r < rows, j < n (a and b ld apart): the
// rows' dot products, each summed in one fixed order.
void row_dots(const float* a, const float* b, int64_t ld, int64_t rows, int64_t n, float* out);

// out[j] = sum_r weights[r] a[r, j] for j < n, the rows summed in order.
void weighted_column_sums(const float* a, int64_t ld, int64_t rows, int64_t n, const float* weights,
                          float* out);

// phi of bfloat16 rows as pairs of rows, as pack_row_pairs writes them (the B
// operand, or A^T): the rows are rows first, first + 1, ... of that matrix,
// so a run starting at an odd row fills the high halves of the pair before
// it, and an odd last row is paired with zero. With `sums`, adds each
// column's phi values to sums[0, width) in row order (from zeroed sums:
// column_sums' values); with `tile`, also writes them there as feature_rows
// does (row r of this call at tile + r * ld_tile).
void feature_row_pairs(FeatureMap phi, const bfloat16* src, int64_t ld_src, int64_t first,
                       int64_t rows, int64_t width, uint32_t* pairs, int64_t ldd, float* sums,
                       float* tile = nullptr, int64_t ld_tile = 0);

}  // namespace mhla::cpu::simd
