// Rank and entropy diagnostics, and the paper's claim on a sample input:
// MHLA's attention matrix has higher rank and lower row entropy than linear
// attention's.
#include "test_support.hpp"

namespace mhla::test {
namespace {

TEST(Analysis, RankOfKnownMatrices) {
  // Outer product: rank 1.  Identity: full rank.
  std::vector<double> outer(5 * 4), eye(6 * 6, 0.0);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 4; ++c) outer[r * 4 + c] = (r + 1.0) * (c - 1.5);
  for (int i = 0; i < 6; ++i) eye[i * 6 + i] = 1.0;
  EXPECT_EQ(numerical_rank(outer, 5, 4), 1);
  EXPECT_EQ(numerical_rank(eye, 6, 6), 6);
  const auto s = singular_values(eye, 6, 6);
  for (double x : s) EXPECT_NEAR(x, 1.0, 1e-12);
  EXPECT_THROW(numerical_rank(eye, 5, 6), Error);
}

TEST(Analysis, EntropyOfUniformAndOneHotRows) {
  std::vector<double> uniform_rows(3 * 8, 0.25), one_hot(3 * 8, 0.0);
  for (int r = 0; r < 3; ++r) one_hot[r * 8 + r] = 2.0;
  EXPECT_NEAR(mean_row_entropy(uniform_rows, 3, 8), std::log(8.0), 1e-12);
  EXPECT_NEAR(mean_row_entropy(one_hot, 3, 8), 0.0, 1e-12);
  uniform_rows[3] = -1;
  EXPECT_THROW(mean_row_entropy(uniform_rows, 3, 8), Error);
}

TEST(Analysis, MhlaRestoresRankAndSelectivityOverLinearAttention) {
  const int64_t n = 256, dk = 16;
  Case c{"sample", 1, 1, dk, dk, TokenLayout::sequence(n, 16)};
  const Inputs in = make_inputs(c, 42);
  const std::vector<int64_t> qs = c.q_shape();
  Options lin = c.options();
  lin.layout = TokenLayout::sequence(n, n);
  const std::vector<double> one = {1.0};
  const auto a_lin = reference::mhla_attention_matrix(lin, view(in.q, qs), view(in.k, qs),
                                                      view(one, {1, 1}), 0, 0);
  const std::vector<float> w_init = init_mixing(c.layout);
  const std::vector<double> w(w_init.begin(), w_init.end());
  const auto a_mhla = reference::mhla_attention_matrix(c.options(), view(in.q, qs), view(in.k, qs),
                                                       view(w, c.w_shape()), 0, 0);
  const int64_t rank_lin = numerical_rank(a_lin, n, n), rank_mhla = numerical_rank(a_mhla, n, n);
  EXPECT_LE(rank_lin, dk);  // phi(Q) phi(K)^T has rank <= Dk
  EXPECT_GT(rank_mhla, 4 * dk);
  EXPECT_LT(mean_row_entropy(a_mhla, n, n), mean_row_entropy(a_lin, n, n));
}

}  // namespace
}  // namespace mhla::test
