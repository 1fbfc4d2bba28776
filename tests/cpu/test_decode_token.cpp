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
      std::vector<float> kap(static_cast<size_t>(dk)), u(static_cast<size_t>(dk)),
          v(static_cast<size_t>(dv)), prefix(static_cast<size_t>(dk * x1)),
          running(static_cast<size_t>(dk * x1));
      for (auto* x : {&kap, &u, &v, &prefix, &running})
        for (float& e : *x) e = dist(rng);
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
      const float den = mhla::cpu::simd::decode_token(dk, dv, kap.data(), v.data(), u.data(), wii,
                                                      prefix.data(), running.data(), y.data());
      for (size_t i = 0; i < running.size(); ++i)
        ASSERT_NEAR(running[i], want_running[i], 1e-5) << "running[" << i << "]";
      for (int64_t e = 0; e < dv; ++e) ASSERT_NEAR(y[size_t(e)], want_y[size_t(e)], 1e-4 * dk);
      EXPECT_NEAR(den, want_y[size_t(dv)], 1e-4 * dk);
      EXPECT_EQ(y[size_t(dv)], 42.0f) << "wrote past y";
    }
}

INSTANTIATE_TEST_SUITE_P(EveryRunnableTarget, DecodeToken,
                         ::testing::ValuesIn(mhla::cpu::simd::runnable_targets()),
                         [](const auto& info) { return mhla::cpu::simd::target_name(info.param); });

}  // namespace
