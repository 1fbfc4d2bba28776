#include "cpu/block_products.hpp"

#include <cassert>
#include <vector>

#include "cpu/simd/bf16_products.hpp"
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

void bf16_block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, simd::LineRuns prefetch) {
  assert(!(ta && tb));
  thread_local mhla::detail::LineAlignedVector<uint32_t> a_pairs, b_pairs;
  const int64_t pairs = (k + 1) / 2, ldb_pairs = simd::padded_pair_stride(n);
  a_pairs.resize(size_t(m * pairs));
  b_pairs.resize(size_t(pairs * ldb_pairs));
  // A: pairs down its columns when transposed (read as A^T), else along its rows.
  if (ta)
    simd::pack_row_pairs(a, lda, k, m, a_pairs.data(), m);
  else
    simd::pack_column_pairs(a, lda, m, k, a_pairs.data(), pairs);
  const simd::PairStrided op_a =
      ta ? simd::PairStrided{a_pairs.data(), 1, m} : simd::PairStrided{a_pairs.data(), pairs, 1};
  // B by rows of pairs: a transposed B's pairs run along its rows.
  if (tb)
    simd::pack_transposed_pairs(b, ldb, n, k, b_pairs.data(), ldb_pairs);
  else
    simd::pack_row_pairs(b, ldb, k, n, b_pairs.data(), ldb_pairs);
  simd::gemm_bf16(m, n, pairs, op_a, b_pairs.data(), ldb_pairs, c, ldc, prefetch);
}

}  // namespace mhla::cpu
