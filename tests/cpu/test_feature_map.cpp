// The SIMD feature maps against exp and max in double on every instruction set
// this CPU runs: a sweep of elu+1's negative side down past where exp
// underflows, random values, ragged row tails and strided rows (nothing
// written between rows), and the special values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/simd/feature_map.hpp"
#include "cpu/simd/isa.hpp"

namespace {

using mhla::FeatureMap;

class FeatureMapKernel : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { mhla::cpu::simd::pin_target(GetParam()); }
  void TearDown() override { mhla::cpu::simd::pin_target(0); }
};

double elu1(double x) { return x > 0 ? x + 1 : std::exp(x); }

// Within 4 float ulp of the exact value, or within two of the smallest
// subnormal where the result is tiny.
void expect_close(float x, float got, double want) {
  const double tolerance = std::max(4 * double(std::numeric_limits<float>::epsilon()) * want,
                                    2 * double(std::numeric_limits<float>::denorm_min()));
  EXPECT_NEAR(got, want, tolerance) << "x = " << x;
}

TEST_P(FeatureMapKernel, Elu1MatchesExpAcrossItsRange) {
  std::vector<float> x;
  for (float t = -110.0f; t < 4.0f; t += 0.0137f) x.push_back(t);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int i = 0; i < 5000; ++i) x.push_back(dist(rng));
  for (float t : {-87.3f, -88.0f, -100.0f, -103.2f, -103.9f, -104.0f, -104.5f, -300.0f, -1e30f,
                  -0.34657359f, 0.34657359f, 1e-30f, -1e-30f, 1e30f})
    x.push_back(t);
  std::vector<float> y = x;
  mhla::cpu::simd::apply_feature(FeatureMap::elu1, y.data(), int64_t(y.size()), y.data(), 1,
                                 int64_t(y.size()), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > 0) {
      EXPECT_EQ(y[i], x[i] + 1.0f) << "x = " << x[i];  // one float addition, exactly
    } else {
      expect_close(x[i], y[i], elu1(x[i]));
    }
  }
}

// The AVX-512 form (cpu/simd/elu1_avx512.hpp, a table of 2^(j / 16) and a
// cubic) on every 127th float from 0 down to -110: within 1.07 ulp of exp in
// double (all floats checked once: at most 1.069), within one smallest
// subnormal where the result is subnormal. A wrong table entry or coefficient
// of the cubic's takes the error past the bound.
TEST_P(FeatureMapKernel, Elu1OnAvx512IsWithinItsUlpBound) {
  if (!mhla::cpu::simd::active_target_is_avx512())
    GTEST_SKIP() << "the other targets use glibc's expf";
  constexpr uint32_t kFirst = 0x80000000u, kLast = 0xC2DC0000u, kStep = 127;  // -0 .. -110
  std::vector<float> x;
  for (uint64_t bits = kFirst; bits < kLast; bits += kStep)
    x.push_back(std::bit_cast<float>(uint32_t(bits)));
  std::vector<float> y(x.size());
  mhla::cpu::simd::apply_feature(FeatureMap::elu1, x.data(), int64_t(x.size()), y.data(), 1,
                                 int64_t(x.size()), int64_t(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i])), error = std::abs(double(y[i]) - want);
    if (want < double(std::numeric_limits<float>::min())) {
      ASSERT_LE(error, double(std::numeric_limits<float>::denorm_min())) << "x = " << x[i];
      continue;
    }
    int exponent = 0;
    std::frexp(want, &exponent);
    const double ulps = error / std::ldexp(1.0, exponent - 24);
    ASSERT_LE(ulps, 1.07) << "x = " << x[i];
    worst = std::max(worst, ulps);
  }
  EXPECT_GT(worst, 0.5) << "some results are expected off the nearest float";
}

TEST_P(FeatureMapKernel, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {std::nanf(""), -inf, inf, 0.0f, -0.0f, -std::nanf("")};
  mhla::cpu::simd::apply_feature(FeatureMap::elu1, x.data(), 0, x.data(), 1, int64_t(x.size()), 0);
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[2], inf);
  EXPECT_EQ(x[3], 1.0f);
  EXPECT_EQ(x[4], 1.0f);
  EXPECT_TRUE(std::isnan(x[5]));
  std::vector<float> r = {std::nanf(""), -inf, inf, -2.0f, 3.0f};
  mhla::cpu::simd::apply_feature(FeatureMap::relu, r.data(), 0, r.data(), 1, int64_t(r.size()), 0);
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], 0.0f);
  EXPECT_EQ(r[2], inf);
  EXPECT_EQ(r[3], 0.0f);
  EXPECT_EQ(r[4], 3.0f);
}

// In place (src = tile), rows of ragged widths inside wider rows: every row's
// values are mapped, and the gap between rows is left as it was. identity
// changes nothing.
TEST_P(FeatureMapKernel, StridedRowsWithRaggedTails) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-6.0f, 3.0f);
  for (const FeatureMap phi : {FeatureMap::elu1, FeatureMap::relu, FeatureMap::identity})
    for (int64_t width : {1, 3, 15, 16, 17, 31, 33, 64, 65}) {
      const int64_t rows = 5, ld = width + 7;
      std::vector<float> tile(size_t(rows * ld));
      for (float& v : tile) v = dist(rng);
      const std::vector<float> before = tile;
      mhla::cpu::simd::apply_feature(phi, tile.data(), ld, tile.data(), rows, width, ld);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld; ++c) {
          const size_t i = size_t(r * ld + c);
          const float x = before[i];
          if (c >= width || phi == FeatureMap::identity)
            EXPECT_EQ(tile[i], x) << "changed outside the rows at (" << r << ", " << c << ")";
          else if (phi == FeatureMap::relu)
            EXPECT_EQ(tile[i], std::max(x, 0.0f));
          else
            expect_close(x, tile[i], elu1(x));
        }
    }
}

// From rows of another array (a gather): each row read at its own stride, the
// source left as it was.
TEST_P(FeatureMapKernel, MapsRowsOfAnotherArray) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-6.0f, 3.0f);
  for (const FeatureMap phi : {FeatureMap::elu1, FeatureMap::relu, FeatureMap::identity}) {
    const int64_t rows = 9, width = 37, ld_src = 512, ld = 40;
    std::vector<float> src(size_t(rows * ld_src)), tile(size_t(rows * ld), -7.0f);
    for (float& v : src) v = dist(rng);
    const std::vector<float> before = src;
    mhla::cpu::simd::apply_feature(phi, src.data(), ld_src, tile.data(), rows, width, ld);
    EXPECT_EQ(src, before);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        const float got = tile[size_t(r * ld + c)], x = src[size_t(r * ld_src + c)];
        if (c >= width)
          EXPECT_EQ(got, -7.0f);
        else if (phi == FeatureMap::elu1)
          expect_close(x, got, elu1(x));
        else
          EXPECT_EQ(got, phi == FeatureMap::relu ? std::max(x, 0.0f) : x);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryRunnableTarget, FeatureMapKernel,
                         ::testing::ValuesIn(mhla::cpu::simd::runnable_targets()),
                         [](const auto& info) { return mhla::cpu::simd::target_name(info.param); });

}  // namespace
