// The SIMD block products against a plain triple loop in double, on every
// instruction set this CPU can run: random shapes with ragged row tiles and
// column tails, both ways of reading A, with and without accumulation, and
// nothing written outside C.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "cpu/simd/block_gemm.hpp"
#include "cpu/simd/isa.hpp"

namespace {

using mhla::cpu::simd::Strided;

class BlockGemm : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { mhla::cpu::simd::pin_target(GetParam()); }
  void TearDown() override { mhla::cpu::simd::pin_target(0); }
};

void check_product(int64_t m, int64_t n, int64_t k, bool transposed_a, bool accumulate,
                   std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // Leading dimensions wider than the matrices, so that reads past a row or
  // writes past C's columns would show.
  const int64_t lda = (transposed_a ? m : k) + 3, ldb = n + 5, ldc = n + 7;
  std::vector<float> a(size_t((transposed_a ? k : m) * lda)), b(size_t(k * ldb));
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  constexpr float kSentinel = 12345.0f;
  std::vector<float> c(size_t(m * ldc), kSentinel);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[size_t(i * ldc + j)] = dist(rng);
  const std::vector<float> before = c;
  const float alpha = 0.75f;
  const Strided op_a = transposed_a ? Strided{a.data(), 1, lda} : Strided{a.data(), lda, 1};
  mhla::cpu::simd::gemm(m, n, k, alpha, op_a, b.data(), ldb, accumulate, c.data(), ldc);

  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[size_t(i * ldc + j)];
      if (j >= n) {
        ASSERT_EQ(got, kSentinel) << "wrote past C's columns at (" << i << ", " << j << ")";
        continue;
      }
      double want = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double ap = transposed_a ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
        want += ap * b[size_t(p * ldb + j)];
        magnitude += std::abs(ap * b[size_t(p * ldb + j)]);
      }
      want *= alpha;
      if (accumulate) want += before[size_t(i * ldc + j)];
      ASSERT_NEAR(got, want, 1e-6 * (magnitude + 1.0) * 4)
          << "m=" << m << " n=" << n << " k=" << k << " transposed_a=" << transposed_a
          << " accumulate=" << accumulate << " at (" << i << ", " << j << ")";
    }
  }
}

TEST_P(BlockGemm, MatchesPlainLoopsOnRaggedShapes) {
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {1, 2, 3, 5, 6, 7, 8, 13, 16, 17, 31, 33, 64, 65, 70};
  std::uniform_int_distribution<size_t> pick(0, sizes.size() - 1);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t m = sizes[pick(rng)], n = sizes[pick(rng)], k = sizes[pick(rng)];
    check_product(m, n, k, trial % 2 == 1, trial % 3 == 0, rng);
  }
  // The shapes of the operator's blocks (C = 128, D = 64, the ones column).
  check_product(128, 65, 64, false, false, rng);
  check_product(64, 65, 128, true, false, rng);
  check_product(128, 64, 128, false, true, rng);
}

// Requesting lines is a hint: the product is bit for bit the one without,
// whether the runs hold fewer or more lines than the product has steps (the
// cursor must stop after the last run: the runs are sized exactly, so that
// reading past them shows under the sanitizers), none, reads or writes.
TEST_P(BlockGemm, LineRequestsLeaveTheProductUnchanged) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  alignas(64) static float elsewhere[64 * 1024];
  const char* base = reinterpret_cast<const char*>(elsewhere);
  using Run = mhla::cpu::simd::LineRuns::Run;
  const std::vector<std::vector<Run>> listings = {
      {},
      {{base, 256, 1, 1, false}},
      {{base, 2048, 64, 4, false}, {base + 64, 2048, 64, 4, true}},
      {{base, 2048, 100, 16, false}, {base + 1024, 128, 300, 1, true}, {base, 64, 3, 2, false}}};
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{128, 64, 64}, {64, 65, 128}, {7, 17, 5}, {1, 1, 1}}) {
    std::vector<float> a(size_t(m * k)), b(size_t(k * n));
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    std::vector<float> plain(size_t(m * n));
    mhla::cpu::simd::gemm(m, n, k, 1.0f, {a.data(), k, 1}, b.data(), n, false, plain.data(), n);
    for (const std::vector<Run>& listed : listings) {
      const std::vector<Run> runs = listed;  // exactly sized
      std::vector<float> c(size_t(m * n));
      mhla::cpu::simd::gemm(m, n, k, 1.0f, {a.data(), k, 1}, b.data(), n, false, c.data(), n,
                            {runs.data(), int64_t(runs.size())});
      ASSERT_EQ(c, plain) << "m=" << m << " n=" << n << " k=" << k << " runs=" << runs.size();
    }
  }
}

// B^T for the products: whole 16 x 16 squares (in registers on AVX-512),
// ragged edges on either side, wide leading dimensions; every element moved
// exactly and nothing written past dst.
TEST_P(BlockGemm, TransposeMovesEveryElement) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t n : {1, 5, 16, 17, 32, 64, 65, 130})
    for (int64_t k : {1, 15, 16, 31, 48, 65}) {
      const int64_t ldb = k + 3;
      std::vector<float> b(size_t(n * ldb));
      for (float& x : b) x = dist(rng);
      std::vector<float> dst(size_t(k * n + 5), 99.0f);
      mhla::cpu::simd::transpose(b.data(), ldb, n, k, dst.data());
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(dst[size_t(p * n + j)], b[size_t(j * ldb + p)])
              << "n=" << n << " k=" << k << " at (" << p << ", " << j << ")";
      for (size_t i = size_t(k * n); i < dst.size(); ++i) ASSERT_EQ(dst[i], 99.0f);
    }
}

TEST_P(BlockGemm, EmptyInnerDimensionGivesZerosOrKeepsC) {
  std::vector<float> c(6, 3.0f);
  const float unused = 0;
  mhla::cpu::simd::gemm(2, 3, 0, 1.0f, {&unused, 1, 1}, &unused, 3, true, c.data(), 3);
  for (float x : c) EXPECT_EQ(x, 3.0f);
  mhla::cpu::simd::gemm(2, 3, 0, 1.0f, {&unused, 1, 1}, &unused, 3, false, c.data(), 3);
  for (float x : c) EXPECT_EQ(x, 0.0f);
}

TEST_P(BlockGemm, RunsOnThePinnedTarget) {
  EXPECT_EQ(mhla::cpu::simd::active_target(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(EveryRunnableTarget, BlockGemm,
                         ::testing::ValuesIn(mhla::cpu::simd::runnable_targets()),
                         [](const auto& info) { return mhla::cpu::simd::target_name(info.param); });

}  // namespace
