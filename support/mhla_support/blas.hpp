#pragma once
// Row-major GEMM/GEMV through CBLAS, overloaded on float and double so the
// kernels are written once for both. Called from inside OpenMP regions, the
// OpenMP build of OpenBLAS runs each call on the calling thread.
#include <cblas.h>

#include <cstdint>

namespace mhla::cpu {

inline CBLAS_TRANSPOSE op(bool transpose) { return transpose ? CblasTrans : CblasNoTrans; }

// C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), blasint(m), blasint(n), blasint(k), alpha, a,
              blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), blasint(m), blasint(n), blasint(k), alpha, a,
              blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

// y[m] = A[m,n] x (x with stride incx)
inline void gemv(int64_t m, int64_t n, const float* a, int64_t lda, const float* x, int64_t incx,
                 float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, blasint(m), blasint(n), 1.0f, a, blasint(lda), x,
              blasint(incx), 0.0f, y, 1);
}
inline void gemv(int64_t m, int64_t n, const double* a, int64_t lda, const double* x, int64_t incx,
                 double* y) {
  cblas_dgemv(CblasRowMajor, CblasNoTrans, blasint(m), blasint(n), 1.0, a, blasint(lda), x,
              blasint(incx), 0.0, y, 1);
}

}  // namespace mhla::cpu
