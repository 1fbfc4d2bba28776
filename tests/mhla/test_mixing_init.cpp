#include "test_support.hpp"

namespace mhla::test {
namespace {

void check_rows_stochastic(const std::vector<float>& w, int64_t m, bool causal) {
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t b = 0; b < m; ++b) {
      EXPECT_GE(w[i * m + b], 0.0f);
      if (causal && b > i) {
        EXPECT_EQ(w[i * m + b], 0.0f);
      }
      sum += w[i * m + b];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << i;
  }
}

TEST(MixingInit, RowsSumToOneForEveryTransformAndLayout) {
  for (auto layout : {TokenLayout::sequence(100, 10), TokenLayout::grid2d(14, 14, 7, 7),
                      TokenLayout::grid2d(9, 13, 4, 4), TokenLayout::grid3d(5, 6, 7, 2, 3, 3)})
    for (auto t : {MixingTransform::linear, MixingTransform::cosine, MixingTransform::exp,
                   MixingTransform::gaussian, MixingTransform::local, MixingTransform::uniform}) {
      MixingInit init;
      init.transform = t;
      check_rows_stochastic(init_mixing(layout, init), layout.num_blocks(), false);
    }
}

TEST(MixingInit, LinearTransformMatchesHandComputedValues) {
  // Three blocks in a row: distances 0, 1, 2 from block 0 with dmax = 2, so
  // weights 1, 0.5, 0 normalised to 2/3, 1/3, 0; the middle row reads 0.5, 1, 0.5.
  const auto w = init_mixing(TokenLayout::sequence(30, 10));
  EXPECT_NEAR(w[0], 2.0 / 3, 1e-7);
  EXPECT_NEAR(w[1], 1.0 / 3, 1e-7);
  EXPECT_NEAR(w[2], 0.0, 1e-7);
  EXPECT_NEAR(w[3], 0.25, 1e-7);
  EXPECT_NEAR(w[4], 0.5, 1e-7);
  EXPECT_NEAR(w[5], 0.25, 1e-7);
}

TEST(MixingInit, WeightsDecreaseWithDistanceOnA2DGrid) {
  const TokenLayout layout = TokenLayout::grid2d(16, 16, 4, 4);  // 4x4 blocks
  for (auto t : {MixingTransform::linear, MixingTransform::cosine, MixingTransform::exp,
                 MixingTransform::gaussian}) {
    MixingInit init;
    init.transform = t;
    const auto w = init_mixing(layout, init);
    // From block 5 (row 1, col 1): itself > right neighbour (6) > two to the right (7).
    EXPECT_GT(w[5 * 16 + 5], w[5 * 16 + 6]) << to_string(t);
    EXPECT_GT(w[5 * 16 + 6], w[5 * 16 + 7]) << to_string(t);
  }
  MixingInit local;
  local.transform = MixingTransform::local;
  local.threshold = 1.0;
  const auto w = init_mixing(layout, local);
  EXPECT_NEAR(w[5 * 16 + 5], 0.2f, 1e-7);  // itself + 4 direct neighbours
  EXPECT_EQ(w[5 * 16 + 10], 0.0f);         // diagonal neighbour at sqrt(2) > 1
}

TEST(MixingInit, CausalIsLowerTriangular) {
  MixingInit init;
  init.causal = true;
  init.transform = MixingTransform::uniform;
  const auto w = init_mixing(TokenLayout::sequence(50, 10), init);
  check_rows_stochastic(w, 5, true);
  EXPECT_NEAR(w[3 * 5 + 0], 0.25, 1e-7);  // row i uniform 1/(i+1)
  init.transform = MixingTransform::linear;
  const auto l = init_mixing(TokenLayout::sequence(50, 10), init);
  check_rows_stochastic(l, 5, true);
  EXPECT_GT(l[4 * 5 + 4], l[4 * 5 + 0]);
}

TEST(MixingInit, SingleBlockAndBadArguments) {
  EXPECT_EQ(init_mixing(TokenLayout::sequence(5, 10)), std::vector<float>{1.0f});
  MixingInit causal;  // block-causal 2D/3D layouts use the lower triangle too
  causal.causal = true;
  check_rows_stochastic(init_mixing(TokenLayout::grid3d(4, 4, 4, 2, 4, 4), causal), 2, true);
  MixingInit bad;
  bad.transform = MixingTransform::exp;
  bad.sigma = 0;
  EXPECT_THROW(init_mixing(TokenLayout::sequence(8, 2), bad), Error);
  EXPECT_THROW(init_mixing(TokenLayout()), Error);
  EXPECT_THROW(parse_mixing_transform("quadratic"), Error);
  EXPECT_EQ(parse_mixing_transform("cos"), MixingTransform::cosine);
}

TEST(MixingInit, ToeplitzInitAndExpansion) {
  MixingInit exp;
  exp.transform = MixingTransform::exp;
  exp.sigma = 2;
  const std::vector<float> w = init_toeplitz_mixing(3, exp);
  ASSERT_EQ(w.size(), 4u);
  for (int d = 0; d < 4; ++d) EXPECT_FLOAT_EQ(w[d], std::exp(-d / 2.0f));
  EXPECT_EQ(init_toeplitz_mixing(2), (std::vector<float>{1.0f, 0.5f, 0.0f}));  // linear
  EXPECT_THROW(init_toeplitz_mixing(-1), Error);

  const std::vector<float> t = {3, 2, 1};  // L = 2: distances 0, 1, then the tail
  EXPECT_EQ(toeplitz_to_dense({t.data(), {3}}, 4), (std::vector<float>{3, 0, 0, 0,  //
                                                                       2, 3, 0, 0,  //
                                                                       1, 2, 3, 0,  //
                                                                       1, 1, 2, 3}));
  const std::vector<float> per_head = {1, 5, 2, 6};  // [H = 2, L + 1 = 2]
  EXPECT_EQ(toeplitz_to_dense({per_head.data(), {2, 2}}, 2),
            (std::vector<float>{1, 0, 5, 1, 2, 0, 6, 2}));
  EXPECT_THROW(toeplitz_to_dense({t.data(), {1, 1, 3}}, 4), Error);
}

}  // namespace
}  // namespace mhla::test
