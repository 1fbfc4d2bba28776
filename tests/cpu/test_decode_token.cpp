// The decoder's SIMD step against plain loops on every instruction set this
// CPU runs, for widths that leave ragged vector tails and several panels.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cpu/simd/decode_token.hpp"
#include "cpu/simd/isa.hpp"

namespace {

class DecodeToken : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { mhla::cpu::simd::pin_target(GetParam()); }
  void TearDown() override { mhla::cpu::simd::pin_target(0); }
};

TEST_P(DecodeToken, MatchesPlainLoops) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t dk : {1, 3, 8, 17, 64})
    for (int64_t dv : {1, 3, 8, 17, 33, 64, 65, 100}) {
      SCOPED_TRACE("dk=" + std::to_string(dk) + " dv=" + std::to_string(dv));
      const int64_t x1 = dv + 1;
      // The state in the operator's [Dk, Dv + 1] layout, then in the kernel's.
      std::vector<float> kap(static_cast<size_t>(dk)), u(static_cast<size_t>(dk)),
          v(static_cast<size_t>(dv)), prefix(static_cast<size_t>(dk * x1)),
          running(static_cast<size_t>(dk * x1));
      for (auto* x : {&kap, &u, &v, &prefix, &running})
        for (float& e : *x) e = dist(rng);
      const mhla::cpu::simd::StateLayout layout(dk, dv);
      ASSERT_EQ(layout.row % 16, 0);
      ASSERT_GE(layout.row, dv);
      std::vector<float> stored_prefix(size_t(layout.floats), -1.0f),
          stored_running(size_t(layout.floats), -1.0f);
      layout.store(prefix.data(), stored_prefix.data());
      layout.store(running.data(), stored_running.data());

      const float wii = 0.7f;
      std::vector<double> want_running(running.begin(), running.end()), want_y(size_t(x1), 0.0);
      for (int64_t a = 0; a < dk; ++a)
        for (int64_t e = 0; e < x1; ++e) {
          const double ve = e < dv ? v[size_t(e)] : 1.0;
          double& r = want_running[size_t(a * x1 + e)];
          r += double(kap[size_t(a)]) * ve;
          want_y[size_t(e)] += double(u[size_t(a)]) * (prefix[size_t(a * x1 + e)] + wii * r);
        }
      // One element past y must stay untouched.
      std::vector<float> y(size_t(dv) + 1, 42.0f);
      const float den =
          mhla::cpu::simd::decode_token(layout, kap.data(), v.data(), u.data(), wii,
                                        stored_prefix.data(), stored_running.data(), y.data());
      std::vector<float> got_running(running.size());
      layout.load(stored_running.data(), got_running.data());
      for (size_t i = 0; i < running.size(); ++i)
        ASSERT_NEAR(got_running[i], want_running[i], 1e-5) << "running[" << i << "]";
      for (int64_t e = 0; e < dv; ++e) ASSERT_NEAR(y[size_t(e)], want_y[size_t(e)], 1e-4 * dk);
      EXPECT_NEAR(den, want_y[size_t(dv)], 1e-4 * dk);
      EXPECT_EQ(y[size_t(dv)], 42.0f) << "wrote past y";
      // The padding (past Dv in each row, past Dk in the key sums) stays zero.
      for (int64_t a = 0; a < dk; ++a)
        for (int64_t e = dv; e < layout.row; ++e)
          ASSERT_EQ(stored_running[size_t(a * layout.row + e)], 0.0f) << "row " << a;
      for (int64_t a = dk; a < layout.z_floats; ++a)
        ASSERT_EQ(stored_running[size_t(dk * layout.row + a)], 0.0f) << "key sum " << a;
    }
}

TEST(StateLayout, StoresAndLoadsTheOperatorsSummary) {
  for (int64_t dk : {1, 16, 17})
    for (int64_t dv : {1, 15, 16, 33}) {
      const mhla::cpu::simd::StateLayout layout(dk, dv);
      EXPECT_EQ(layout.floats, dk * layout.row + layout.z_floats);
      EXPECT_EQ(layout.z_floats % 16, 0);
      std::vector<float> summary(size_t(dk * (dv + 1))), stored(size_t(layout.floats), 5.0f);
      for (size_t i = 0; i < summary.size(); ++i) summary[i] = float(i + 1);
      layout.store(summary.data(), stored.data());
      // S row a at a * row, z[a] after the rows; everything else zero.
      for (int64_t a = 0; a < dk; ++a) {
        EXPECT_EQ(stored[size_t(a * layout.row)], summary[size_t(a * (dv + 1))]);
        EXPECT_EQ(stored[size_t(dk * layout.row + a)], summary[size_t(a * (dv + 1) + dv)]);
      }
      int64_t nonzero = 0;
      for (float e : stored) nonzero += e != 0.0f;
      EXPECT_EQ(nonzero, dk * (dv + 1));
      std::vector<float> back(summary.size());
      layout.load(stored.data(), back.data());
      EXPECT_EQ(back, summary);
    }
}

INSTANTIATE_TEST_SUITE_P(EveryRunnableTarget, DecodeToken,
                         ::testing::ValuesIn(mhla::cpu::simd::runnable_targets()),
                         [](const auto& info) { return mhla::cpu::simd::target_name(info.param); });

}  // namespace
