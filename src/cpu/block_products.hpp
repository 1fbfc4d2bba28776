#pragma once
// The per-block matrix products of ChunkedAttention and the dense mix, in BLAS's calling
// convention: float runs on the SIMD kernels (cpu/simd/block_gemm.hpp), double
// (the checking precision) through BLAS. beta is 0 or 1.
#include <algorithm>
#include <cstdint>

#include "cpu/simd/block_gemm.hpp"
#include "mhla_support/blas.hpp"

namespace mhla::cpu {

// dst[p * n + j] = b[j * ldb + p] for j < n, p < k: B^T of a row-major [n, k]
// B, for products that read their B operand by rows. float by the SIMD
// kernel (in registers on AVX-512: element by element the transposes took
// 5.9% of the forward+backward at N = 16384); double sixteen rows of B at a
// time, so that each row of dst is written sixteen values at a stretch (a
// row-by-row loop made the causal forward+backward 1.09x slower at
// N = 65536).
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

}  // namespace mhla::cpu
