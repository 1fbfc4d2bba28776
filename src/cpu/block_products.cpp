#include "cpu/block_products.hpp"

#include <cassert>
#include <vector>

#include "cpu/simd/block_gemm.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {

void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                simd::LineRuns prefetch) {
  assert(beta == 0.0f || beta == 1.0f);
  // The kernel reads A with any strides but B by rows: a transposed B (at
  // most a [C, Dv + 1] block tile, against the O(C D^2) product) is copied
  // into a per-thread buffer first.
  if (tb) {
    thread_local mhla::detail::LineAlignedVector<float> transposed;
    transposed.resize(size_t(k * n));
    transpose(b, ldb, n, k, transposed.data());
    b = transposed.data();
    ldb = n;
  }
  const simd::Strided op_a = ta ? simd::Strided{a, 1, lda} : simd::Strided{a, lda, 1};
  simd::gemm(m, n, k, alpha, op_a, b, ldb, beta != 0.0f, c, ldc, prefetch);
}

}  // namespace mhla::cpu
