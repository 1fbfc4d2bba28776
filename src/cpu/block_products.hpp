#pragma once
// The per-block matrix products of ChunkedAttention and the dense mix, in BLAS's calling
// convention: float runs on the SIMD kernels (cpu/simd/block_gemm.hpp), double
// (the checking precision) through BLAS. beta is 0 or 1.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/simd/block_gemm.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla_support/blas.hpp"

namespace mhla::cpu {

// dst[p * n + j] = b[j * ldb + p] for j < n, p < k: B^T of a row-major [n, k]
// B, for products that read their B operand by rows. float by the SIMD
// kernel (in registers on AVX-512); double sixteen rows of B at a time, so
// that each row of dst is written sixteen values at a stretch (a row-by-row
// loop made the causal forward+backward slower).
inline void transpose(const float* b, int64_t ldb, int64_t n, int64_t k, float* dst) {
  simd::transpose(b, ldb, n, k, dst);
}
inline void transpose(const double* b, int64_t ldb, int64_t n, int64_t k, double* dst) {
  constexpr int64_t kRowsAtOnce = 16;
  for (int64_t j0 = 0; j0 < n; j0 += kRowsAtOnce) {
    const int64_t j1 = std::min(n, j0 + kRowsAtOnce);
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = j0; j < j1; ++j) dst[p * n + j] = b[j * ldb + p];
  }
}

// C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C, row-major; float
// requests `prefetch`'s lines while it runs (see simd::LineRuns).
void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                simd::LineRuns prefetch = {});

inline void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                       const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                       double* c, int64_t ldc, simd::LineRuns = {}) {
  gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C[m,n] = op(A)[m,k] op(B)[k,n] with A and B rounded to bfloat16 and float
// sums (simd::gemm_bf16; not both transposed): the bfloat16 backward's
// products. The operands are packed into per-thread pair tiles first (O(m k +
// k n) against the O(m n k) product). Only where
// simd::bf16_products_available().
void bf16_block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc,
                     simd::LineRuns prefetch = {});

// sums[a * ld_sums] = sum_r tile[r, a]: z_b = phi(K_b)^T 1, one column apart
// from the GEMMs, whose SIMD tiles would spend a whole pass on it. The sums
// build up in a contiguous row, so that the loop over a vectorises, and are
// then written to their strided column (summing into the column itself
// slowed mhla_bench's forward).
template <typename T>
void column_sums(const T* tile, int64_t rows, int64_t width, T* sums, int64_t ld_sums) {
  thread_local std::vector<T> row;
  row.assign(size_t(width), T(0));
  T* acc = row.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = tile + r * width;
#pragma omp simd
    for (int64_t a = 0; a < width; ++a) acc[a] += x[a];
  }
  for (int64_t a = 0; a < width; ++a) sums[a * ld_sums] = acc[a];
}

}  // namespace mhla::cpu
