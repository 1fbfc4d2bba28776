#pragma once
// The per-block matrix products of ChunkedAttention and the dense mix, in BLAS's calling
// convention: float runs on the SIMD kernels (cpu/simd/block_gemm.hpp), double
// (the checking precision) through BLAS. beta is 0 or 1.
#include <cstdint>

#include "mhla_support/blas.hpp"

namespace mhla::cpu {

// C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C, row-major.
void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

inline void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                       const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                       double* c, int64_t ldc) {
  gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace mhla::cpu
