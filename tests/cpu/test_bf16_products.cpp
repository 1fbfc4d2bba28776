// The bfloat16 products and their helpers (cpu/simd/bf16_products.hpp)
// against plain loops: products on random ragged shapes with strided A and
// nothing written outside C, the pair packings and the narrowing bit for bit
// against mhla::to_bfloat16, the feature rows against core/feature_map.hpp.
// Skipped where the CPU has no AVX512-BF16 (the operator then widens; see
// tests/mhla/test_bfloat16.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/feature_map.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/stream_rows.hpp"
#include "mhla/line_aligned.hpp"

namespace {

using mhla::bfloat16;
using mhla::to_bfloat16;
using mhla::to_float;
using namespace mhla::cpu::simd;

class Bf16Products : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!bf16_products_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  }
};

// Normal floats of varied magnitude (the instruction flushes subnormals).
std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng) * std::ldexp(1.0f, int(rng() % 9) - 4);
  return x;
}

// The instruction set's rounding: to_bfloat16's, with float subnormals
// flushed to (signed) zero.
bfloat16 rounded(float x) {
  return to_bfloat16(std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x);
}

uint32_t pair_bits(float low, float high) {
  return uint32_t(rounded(low).bits) | uint32_t(rounded(high).bits) << 16;
}

TEST_F(Bf16Products, ProductsMatchPlainLoopsOnRaggedShapes) {
  std::mt19937 rng(3);
  const std::vector<int64_t> sizes = {1, 2, 3, 5, 6, 7, 13, 16, 17, 33, 64, 65, 70};
  std::uniform_int_distribution<size_t> pick(0, sizes.size() - 1);
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t m = sizes[pick(rng)], n = sizes[pick(rng)], pairs = sizes[pick(rng)];
    const bool by_rows = trial % 2 == 0;  // A's pairs along rows (row-major) or down columns
    const int64_t lda = (by_rows ? pairs : m) + 3, ldb = n + 5, ldc = n + 7;
    std::vector<uint32_t> a(size_t((by_rows ? m : pairs) * lda)), b(size_t(pairs * ldb));
    for (uint32_t& x : a) x = pair_bits(random_floats(2, rng)[0], random_floats(2, rng)[1]);
    for (uint32_t& x : b) x = pair_bits(random_floats(2, rng)[0], random_floats(2, rng)[1]);
    constexpr float kSentinel = 12345.0f;
    std::vector<float> c(size_t(m * ldc), kSentinel);
    const PairStrided op_a =
        by_rows ? PairStrided{a.data(), lda, 1} : PairStrided{a.data(), 1, lda};
    gemm_bf16(m, n, pairs, op_a, b.data(), ldb, c.data(), ldc);
    const auto half = [](uint32_t word, int which) {
      return double(to_float(bfloat16{uint16_t(which ? word >> 16 : word & 0xffffu)}));
    };
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        const float got = c[size_t(i * ldc + j)];
        if (j >= n) {
          ASSERT_EQ(got, kSentinel) << "wrote past C's columns at (" << i << ", " << j << ")";
          continue;
        }
        double want = 0, magnitude = 0;
        for (int64_t p = 0; p < pairs; ++p) {
          const uint32_t aw = a[size_t(by_rows ? i * lda + p : p * lda + i)];
          const uint32_t bw = b[size_t(p * ldb + j)];
          for (int h = 0; h < 2; ++h) {
            want += half(aw, h) * half(bw, h);
            magnitude += std::abs(half(aw, h) * half(bw, h));
          }
        }
        // Each product of two bfloat16s is exact in float: only the sums round.
        ASSERT_NEAR(got, want, 4 * std::numeric_limits<float>::epsilon() * magnitude * pairs)
            << "m=" << m << " n=" << n << " pairs=" << pairs << " at (" << i << ", " << j << ")";
      }
  }
}

// Into halves of words: each result rounded, in its half; the other half kept
// (or zeroed), and nothing written past n columns.
TEST_F(Bf16Products, ProductsIntoHalvesRoundTheFloatProducts) {
  std::mt19937 rng(8);
  for (const auto& [m, n, pairs] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 64, 128}, {7, 17, 5}, {1, 65, 3}, {13, 33, 1}}) {
    std::vector<uint32_t> a(size_t(m * pairs)), b(size_t(pairs * n));
    for (uint32_t& x : a) x = pair_bits(random_floats(1, rng)[0], random_floats(1, rng)[0]);
    for (uint32_t& x : b) x = pair_bits(random_floats(1, rng)[0], random_floats(1, rng)[0]);
    const int64_t ldc = n + 3;
    std::vector<float> c(size_t(m * ldc));
    gemm_bf16(m, n, pairs, {a.data(), pairs, 1}, b.data(), n, c.data(), ldc);
    for (int half : {0, 1})
      for (bool zero_other : {false, true}) {
        if (half == 1 && zero_other) continue;
        std::vector<uint32_t> words(size_t(m * ldc), 0xABCDABCDu);
        gemm_bf16_halves(m, n, pairs, {a.data(), pairs, 1}, b.data(), n, words.data(), ldc, half,
                         zero_other);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const uint32_t got = words[size_t(i * ldc + j)];
            if (j >= n) {
              ASSERT_EQ(got, 0xABCDABCDu) << "wrote past column " << n;
              continue;
            }
            const uint32_t mine = rounded(c[size_t(i * ldc + j)]).bits;
            const uint32_t other = zero_other ? 0u : 0xABCDu;
            ASSERT_EQ(got, half ? (mine << 16 | other) : (other << 16 | mine))
                << m << " x " << n << " x " << pairs << " half " << half << " at (" << i << ", "
                << j << ")";
          }
      }
  }
}

TEST_F(Bf16Products, PackingsRoundLikeToBfloat16) {
  std::mt19937 rng(4);
  for (const auto& [rows, width] :
       {std::pair<int64_t, int64_t>{1, 1}, {2, 16}, {7, 33}, {17, 31}, {33, 70}, {64, 65}}) {
    const int64_t lds = width + 2;
    std::vector<float> src = random_floats(size_t(rows * lds), rng);
    // Ties (an odd and an even last kept bit) and NaN must round as to_bfloat16 does.
    src[0] = std::bit_cast<float>(0x3F808000u);
    if (src.size() > 1) src[1] = std::bit_cast<float>(0x3F818000u);
    if (src.size() > 2) src[2] = std::numeric_limits<float>::quiet_NaN();
    const auto at = [&](int64_t r, int64_t c) {
      return r < rows && c < width ? src[size_t(r * lds + c)] : 0.0f;
    };
    const int64_t row_pairs = (rows + 1) / 2, col_pairs = (width + 1) / 2;
    std::vector<uint32_t> by_rows(size_t(row_pairs * width)), by_cols(size_t(rows * col_pairs)),
        transposed(size_t(col_pairs * (rows + 3)), 0xdeadbeefu);
    pack_row_pairs(src.data(), lds, rows, width, by_rows.data(), width);
    pack_column_pairs(src.data(), lds, rows, width, by_cols.data(), col_pairs);
    pack_transposed_pairs(src.data(), lds, rows, width, transposed.data(), rows + 3);
    for (int64_t p = 0; p < row_pairs; ++p)
      for (int64_t j = 0; j < width; ++j)
        ASSERT_EQ(by_rows[size_t(p * width + j)], pair_bits(at(2 * p, j), at(2 * p + 1, j)))
            << "row pair " << p << ", column " << j << " of " << rows << " x " << width;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0; p < col_pairs; ++p) {
        ASSERT_EQ(by_cols[size_t(r * col_pairs + p)], pair_bits(at(r, 2 * p), at(r, 2 * p + 1)))
            << "row " << r << ", column pair " << p << " of " << rows << " x " << width;
        ASSERT_EQ(transposed[size_t(p * (rows + 3) + r)], by_cols[size_t(r * col_pairs + p)])
            << "transposed: row " << r << ", column pair " << p;
      }
    for (int64_t p = 0; p < col_pairs; ++p)
      for (int64_t r = rows; r < rows + 3; ++r)
        ASSERT_EQ(transposed[size_t(p * (rows + 3) + r)], 0xdeadbeefu)
            << "transposed: wrote past row " << rows << " of column pair " << p;
  }
}

// Rows scaled and rounded into their destinations, streamed or not (64
// values are two whole lines; the line-aligned rows stream, the others
// cannot), bit for bit against mhla::to_bfloat16, with the probe.
TEST_F(Bf16Products, NarrowingScalesRoundsAndProbes) {
  std::mt19937 rng(5);
  for (bool stream : {false, true}) {
    for (int64_t n : {1, 15, 16, 17, 64, 65}) {
      constexpr int64_t kRows = 3, kLd = 70;
      std::vector<float> src = random_floats(size_t(kRows * kLd), rng);
      const std::vector<float> factors = {0.75f, -2.0f, 0.125f};
      // Row r at a line (r even) or off it by r words, with a guard after it.
      const int64_t stride = 128;
      mhla::detail::LineAlignedVector<bfloat16> out(size_t(kRows * stride), bfloat16{0x5555});
      std::vector<bfloat16*> dst;
      for (int64_t r = 0; r < kRows; ++r) dst.push_back(out.data() + r * stride + (r % 2) * r);
      float probe = narrow_rows(src.data(), kLd, kRows, n, factors.data(), dst.data(), stream);
      if (stream) finish_streaming();
      EXPECT_EQ(probe, 0.0f) << "finite values probe as 0";
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(dst[size_t(r)][j].bits,
                    rounded(src[size_t(r * kLd + j)] * factors[size_t(r)]).bits)
              << "row " << r << ", n " << n << (stream ? ", streamed" : "");
        EXPECT_EQ(dst[size_t(r)][n].bits, 0x5555) << "wrote past n";
      }
      // Finite in float, infinite once rounded: the probe sees the rounded value.
      src[size_t(kLd + n - 1)] = std::numeric_limits<float>::max();
      probe = narrow_rows(src.data(), kLd, kRows, n, factors.data(), dst.data(), stream);
      if (stream) finish_streaming();
      EXPECT_TRUE(std::isnan(probe)) << "n=" << n;
    }
  }
}

// The scatters' rows: phi' from phi's values times the gradient (plus a bias
// row, scaled per row or not, plus the old values when accumulating), rounded
// bit for bit as the float expression, streamed or not, and the probe NaN
// exactly when a rounded value is not finite.
TEST_F(Bf16Products, NarrowedGradientsMatchTheFloatExpression) {
  std::mt19937 rng(8);
  for (mhla::FeatureMap phi :
       {mhla::FeatureMap::identity, mhla::FeatureMap::relu, mhla::FeatureMap::elu1}) {
    for (int mode = 0; mode < 6; ++mode) {
      const bool accumulate = mode == 1 || mode == 4, with_bias = mode >= 2, scaled = mode >= 4,
                 stream = mode == 3 || mode == 5;
      for (int64_t n : {1, 15, 16, 17, 64, 70}) {
        constexpr int64_t kRows = 3, kLd = 72, kStride = 128;
        std::vector<float> features = random_floats(size_t(kRows * kLd), rng);
        const std::vector<float> grad = random_floats(size_t(kRows * kLd), rng);
        const std::vector<float> bias = random_floats(size_t(n), rng),
                                 scales = random_floats(size_t(kRows), rng);
        for (float& y : features) y = std::abs(y) * (rng() % 3 ? 1.0f : -1.0f);
        features[0] = std::numeric_limits<float>::quiet_NaN();
        if (n > 1) features[1] = 1.0f;
        mhla::detail::LineAlignedVector<bfloat16> out(size_t(kRows * kStride));
        for (bfloat16& x : out) x = to_bfloat16(random_floats(1, rng)[0]);
        const std::vector<bfloat16> old(out.begin(), out.end());
        // Row r at a line (r even) or off it by r values.
        std::vector<bfloat16*> dst;
        for (int64_t r = 0; r < kRows; ++r) dst.push_back(out.data() + r * kStride + (r % 2) * r);
        const float probe =
            narrow_gradients(phi, features.data(), kLd, grad.data(), kLd,
                             mhla::cpu::RowBias<float>{with_bias ? bias.data() : nullptr,
                                                       scaled ? scales.data() : nullptr},
                             accumulate, kRows, n, dst.data(), stream);
        if (stream) finish_streaming();
        bool finite = true;
        for (int64_t r = 0; r < kRows; ++r) {
          const size_t at = size_t(r * kStride + (r % 2) * r);
          for (int64_t j = 0; j < n; ++j) {
            float x = grad[size_t(r * kLd + j)];
            if (with_bias)
              x = scaled ? std::fma(scales[size_t(r)], bias[size_t(j)], x) : x + bias[size_t(j)];
            if (accumulate) x += to_float(old[at + size_t(j)]);
            const float y = features[size_t(r * kLd + j)];
            if (phi == mhla::FeatureMap::relu)
              x = mhla::detail::derivative_from_feature<mhla::FeatureMap::relu>(y) * x;
            if (phi == mhla::FeatureMap::elu1)
              x = mhla::detail::derivative_from_feature<mhla::FeatureMap::elu1>(y) * x;
            const bfloat16 want = rounded(x);
            finite = finite && std::isfinite(to_float(want));
            if (std::isnan(x)) {
              ASSERT_TRUE(std::isnan(to_float(out[at + size_t(j)]))) << "NaN must stay NaN";
              continue;
            }
            ASSERT_EQ(out[at + size_t(j)].bits, want.bits)
                << to_string(phi) << ", mode " << mode << ", n " << n << ", row " << r << ", " << j;
          }
          EXPECT_EQ(out[at + size_t(n)].bits, old[at + size_t(n)].bits) << "wrote past n";
        }
        EXPECT_EQ(std::isnan(probe), !finite) << to_string(phi) << ", n " << n;
      }
    }
  }
}

// Scaled bfloat16 rows, rounded into both pair forms row by row, against
// scaling in float and packing the whole matrix, bit for bit (odd row counts
// and widths too), with the float values when asked for.
TEST_F(Bf16Products, ScaledPairsMatchThePackedFloatRows) {
  std::mt19937 rng(9);
  for (const auto& [rows, width] :
       {std::pair<int64_t, int64_t>{1, 1}, {2, 15}, {5, 16}, {3, 17}, {8, 64}, {7, 70}}) {
    const int64_t col_pairs = (width + 1) / 2, row_pairs = (rows + 1) / 2;
    std::vector<bfloat16> src(size_t(rows * width));
    for (bfloat16& x : src) x = to_bfloat16(random_floats(1, rng)[0]);
    std::vector<float> factors = random_floats(size_t(rows), rng), scaled(size_t(rows * width));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j)
        scaled[size_t(r * width + j)] = to_float(src[size_t(r * width + j)]) * factors[size_t(r)];
    std::vector<uint32_t> want_columns(size_t(rows * col_pairs)),
        want_rows(size_t(row_pairs * width));
    pack_column_pairs(scaled.data(), width, rows, width, want_columns.data(), col_pairs);
    pack_row_pairs(scaled.data(), width, rows, width, want_rows.data(), width);

    for (bool with_wide : {false, true}) {
      std::vector<uint32_t> columns(size_t(rows * col_pairs) + 1, 0xdeadbeefu),
          by_rows(size_t(row_pairs * width) + 1, 0xdeadbeefu);
      std::vector<float> wide(size_t(rows * width) + 1, -7.0f);
      for (int64_t r = 0; r < rows; ++r)
        scaled_pairs(src.data() + r * width, width, factors[size_t(r)],
                     columns.data() + r * col_pairs, by_rows.data() + (r / 2) * width, int(r % 2),
                     with_wide ? wide.data() + r * width : nullptr);
      for (size_t i = 0; i < want_columns.size(); ++i)
        ASSERT_EQ(columns[i], want_columns[i])
            << rows << "x" << width << ", column pair word " << i;
      for (size_t i = 0; i < want_rows.size(); ++i)
        ASSERT_EQ(by_rows[i], want_rows[i]) << rows << "x" << width << ", row pair word " << i;
      EXPECT_EQ(columns.back(), 0xdeadbeefu) << "wrote past the column pairs";
      EXPECT_EQ(by_rows.back(), 0xdeadbeefu) << "wrote past the row pairs";
      for (size_t i = 0; i < scaled.size(); ++i)
        ASSERT_EQ(wide[i], with_wide ? scaled[i] : -7.0f) << "float value " << i;
      EXPECT_EQ(wide.back(), -7.0f) << "wrote past the float values";
    }
  }
}

// The rows' dot products and the weighted column sums against double
// precision, on ragged widths, with nothing written past them.
TEST_F(Bf16Products, RowDotsAndWeightedColumnSumsMatchDoublePrecision) {
  std::mt19937 rng(10);
  for (const auto& [rows, n] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 15}, {7, 17}, {256, 64}, {5, 70}, {4, 130}}) {
    const int64_t ld = n + 3;
    const std::vector<float> a = random_floats(size_t(rows * ld), rng),
                             b = random_floats(size_t(rows * ld), rng),
                             weights = random_floats(size_t(rows), rng);
    std::vector<float> dots(size_t(rows) + 1, -7.0f), sums(size_t(n) + 1, -7.0f);
    row_dots(a.data(), b.data(), ld, rows, n, dots.data());
    weighted_column_sums(a.data(), ld, rows, n, weights.data(), sums.data());
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, size = 0;
      for (int64_t j = 0; j < n; ++j) {
        want += double(a[size_t(r * ld + j)]) * b[size_t(r * ld + j)];
        size += std::abs(double(a[size_t(r * ld + j)]) * b[size_t(r * ld + j)]);
      }
      ASSERT_NEAR(dots[size_t(r)], want, 1e-6 * size) << "row " << r << " of " << rows << "x" << n;
    }
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, size = 0;
      for (int64_t r = 0; r < rows; ++r) {
        want += double(weights[size_t(r)]) * a[size_t(r * ld + j)];
        size += std::abs(double(weights[size_t(r)]) * a[size_t(r * ld + j)]);
      }
      ASSERT_NEAR(sums[size_t(j)], want, 1e-6 * size)
          << "column " << j << " of " << rows << "x" << n;
    }
    EXPECT_EQ(dots.back(), -7.0f) << "wrote past the rows";
    EXPECT_EQ(sums.back(), -7.0f) << "wrote past the columns";
  }
}

TEST_F(Bf16Products, FeatureRowsMatchTheFeatureMaps) {
  std::mt19937 rng(6);
  for (mhla::FeatureMap phi :
       {mhla::FeatureMap::identity, mhla::FeatureMap::relu, mhla::FeatureMap::elu1}) {
    for (const auto& [rows, width] : {std::pair<int64_t, int64_t>{1, 1}, {3, 16}, {5, 37}}) {
      const int64_t ld_src = width + 3, ld = width + 1, ld_pairs = (width + 1) / 2 + 1;
      std::vector<bfloat16> src(size_t(rows * ld_src));
      for (size_t i = 0; i < src.size(); ++i) src[i] = to_bfloat16(random_floats(1, rng)[0] * 8);
      src[0] = to_bfloat16(std::numeric_limits<float>::quiet_NaN());
      std::vector<float> tile(size_t(rows * ld), -7.0f);
      std::vector<uint32_t> pairs(size_t(rows * ld_pairs), 0xdeadbeefu);
      feature_rows(phi, src.data(), ld_src, tile.data(), rows, width, ld, pairs.data(), ld_pairs);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          const float x = to_float(src[size_t(r * ld_src + c)]);
          const float want = mhla::detail::feature(phi, x);
          const float got = tile[size_t(r * ld + c)];
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << "NaN must stay NaN";
            continue;
          }
          // elu+1's short exponential for bfloat16 features is within 5.5e-6
          // of exp relatively (the other maps are exact).
          const float tolerance = phi == mhla::FeatureMap::elu1 ? 6e-6f : 0.0f;
          ASSERT_NEAR(got, want, tolerance * std::abs(want)) << to_string(phi) << " of " << x;
        }
        for (int64_t p = 0; p < (width + 1) / 2; ++p) {
          const float high = 2 * p + 1 < width ? tile[size_t(r * ld + 2 * p + 1)] : 0.0f;
          const uint32_t want = pair_bits(tile[size_t(r * ld + 2 * p)], high);
          const uint32_t got = pairs[size_t(r * ld_pairs + p)];
          if (std::isnan(tile[size_t(r * ld + 2 * p)])) continue;
          ASSERT_EQ(got, want) << "row " << r << ", pair " << p;
        }
        EXPECT_EQ(tile[size_t(r * ld + width)], -7.0f) << "wrote past the row";
        EXPECT_EQ(pairs[size_t(r * ld_pairs + ld_pairs - 1)], 0xdeadbeefu)
            << "wrote past the pairs";
      }
    }
  }
}

// Every bfloat16 input (the operator's features read nothing else): elu + 1's
// short exponential within 5.5e-6 relatively of the double-precision value,
// plus half a step where the result is a float subnormal; NaN stays NaN.
TEST_F(Bf16Products, Elu1OfEveryBfloat16IsWithinItsBound) {
  constexpr int64_t kWidth = 256, kRows = 65536 / kWidth;
  std::vector<bfloat16> src(size_t(kRows * kWidth));
  for (size_t i = 0; i < src.size(); ++i) src[i].bits = uint16_t(i);
  std::vector<float> tile(src.size());
  feature_rows(mhla::FeatureMap::elu1, src.data(), kWidth, tile.data(), kRows, kWidth, kWidth);
  double worst = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    const double x = to_float(src[i]);
    const double want = x > 0 ? x + 1 : std::exp(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(tile[i])) << "NaN must stay NaN, bits " << i;
      continue;
    }
    if (std::isinf(want)) {
      ASSERT_EQ(double(tile[i]), want) << "elu1 of " << x;
      continue;
    }
    const double error = std::abs(double(tile[i]) - want);
    ASSERT_LE(error, 5.5e-6 * want + std::ldexp(1.0, -150)) << "elu1 of " << x;
    if (want >= std::ldexp(1.0, -126)) worst = std::max(worst, error / want);
  }
  EXPECT_GT(worst, 1e-7) << "the short form is expected to differ from exp measurably";
}

// The fused form (phi, rounding into pairs of rows, column sums, the float
// tile) against feature_rows, pack_row_pairs and a plain loop over the rows,
// bit for bit, with the rows split into runs that start at odd rows too
// (block tables), with and without the sums and the tile.
TEST_F(Bf16Products, FeatureRowPairsMatchFeatureRowsPackedAndSummed) {
  std::mt19937 rng(7);
  for (mhla::FeatureMap phi :
       {mhla::FeatureMap::identity, mhla::FeatureMap::relu, mhla::FeatureMap::elu1}) {
    for (const auto& [rows, width] :
         {std::pair<int64_t, int64_t>{1, 1}, {2, 16}, {7, 37}, {64, 64}, {5, 70}, {9, 130}}) {
      const int64_t ld_src = width + 3, ldd = width + 2, pairs = (rows + 1) / 2;
      std::vector<bfloat16> src(size_t(rows * ld_src));
      for (size_t i = 0; i < src.size(); ++i) src[i] = to_bfloat16(random_floats(1, rng)[0] * 8);
      src[size_t(ld_src * (rows - 1))] = to_bfloat16(std::numeric_limits<float>::quiet_NaN());
      std::vector<float> tile(size_t(rows * width));
      feature_rows(phi, src.data(), ld_src, tile.data(), rows, width, width);
      std::vector<uint32_t> want(size_t(pairs * ldd), 0xdeadbeefu);
      pack_row_pairs(tile.data(), width, rows, width, want.data(), ldd);
      std::vector<float> want_sums(size_t(width), 0.0f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c) want_sums[size_t(c)] += tile[size_t(r * width + c)];

      for (int split = 0; split < 4; ++split) {
        std::vector<uint32_t> got(size_t(pairs * ldd), 0xdeadbeefu);
        std::vector<float> sums(size_t(width), 0.0f);
        const int64_t ld_tile = width + 1;
        std::vector<float> got_tile(size_t(rows * ld_tile), -7.0f);
        const bool with_tile = split % 2 == 1, with_sums = split != 3;
        std::uniform_int_distribution<int64_t> run_length(1, std::max<int64_t>(1, rows / 2));
        for (int64_t first = 0; first < rows;) {
          const int64_t len = split == 0 ? rows : std::min(rows - first, run_length(rng));
          feature_row_pairs(phi, src.data() + first * ld_src, ld_src, first, len, width, got.data(),
                            ldd, with_sums ? sums.data() : nullptr,
                            with_tile ? got_tile.data() + first * ld_tile : nullptr, ld_tile);
          first += len;
        }
        for (int64_t p = 0; p < pairs; ++p)
          for (int64_t c = 0; c < ldd; ++c)
            ASSERT_EQ(got[size_t(p * ldd + c)], want[size_t(p * ldd + c)])
                << to_string(phi) << " " << rows << "x" << width << ", pair " << p << ", column "
                << c << ", split " << split;
        for (int64_t r = 0; r < rows && with_tile; ++r) {
          for (int64_t c = 0; c < width; ++c)
            ASSERT_EQ(std::bit_cast<uint32_t>(got_tile[size_t(r * ld_tile + c)]),
                      std::bit_cast<uint32_t>(tile[size_t(r * width + c)]))
                << "tile row " << r << ", column " << c << ", split " << split;
          ASSERT_EQ(got_tile[size_t(r * ld_tile + width)], -7.0f) << "wrote past tile row " << r;
        }
        for (int64_t c = 0; c < width; ++c) {
          if (!with_sums) {
            ASSERT_EQ(sums[size_t(c)], 0.0f) << "wrote the sums without being given them";
            continue;
          }
          if (std::isnan(want_sums[size_t(c)])) {
            ASSERT_TRUE(std::isnan(sums[size_t(c)])) << "NaN must stay NaN";
            continue;
          }
          ASSERT_EQ(sums[size_t(c)], want_sums[size_t(c)]) << "column " << c << ", split " << split;
        }
      }
    }
  }
}

}  // namespace
