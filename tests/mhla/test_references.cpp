// The two references are written independently (block summaries vs the
// explicit attention matrix); they must agree before either is trusted, and
// the block reference's gradients must match central finite differences.
#include "test_support.hpp"

namespace mhla::test {
namespace {

struct Gradients {
  std::vector<double> q, k, v, w;
};

Gradients block_gradients(const Case& c, const Inputs& in) {
  Gradients g{std::vector<double>(in.q.size()), std::vector<double>(in.k.size()),
              std::vector<double>(in.v.size()), std::vector<double>(in.w.size())};
  reference::block_backward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                            view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                            view(in.grad_o, c.v_shape()), view(g.q, c.q_shape()),
                            view(g.k, c.q_shape()), view(g.v, c.v_shape()), view(g.w, c.w_shape()));
  return g;
}

class ReferenceAgreement : public testing::TestWithParam<Case> {};

TEST_P(ReferenceAgreement, BlockAndDenseFormsAgree) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 7);
  std::vector<double> o_block(in.v.size()), o_dense(in.v.size());
  reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                           view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                           view(o_block, c.v_shape()));
  reference::dense_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                           view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                           view(o_dense, c.v_shape()));
  EXPECT_CLOSE(o_block, o_dense, 1e-12, "forward");

  const Gradients gb = block_gradients(c, in);
  Gradients gd{std::vector<double>(in.q.size()), std::vector<double>(in.k.size()),
               std::vector<double>(in.v.size()), std::vector<double>(in.w.size())};
  reference::dense_backward(
      c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
      view(in.w, c.w_shape()), view(in.grad_o, c.v_shape()), view(gd.q, c.q_shape()),
      view(gd.k, c.q_shape()), view(gd.v, c.v_shape()), view(gd.w, c.w_shape()));
  EXPECT_CLOSE(gb.q, gd.q, 1e-11, "grad q");
  EXPECT_CLOSE(gb.k, gd.k, 1e-11, "grad k");
  EXPECT_CLOSE(gb.v, gd.v, 1e-11, "grad v");
  EXPECT_CLOSE(gb.w, gd.w, 1e-11, "grad w");
}

INSTANTIATE_TEST_SUITE_P(AllModes, ReferenceAgreement, testing::ValuesIn(all_mode_cases()),
                         case_name);

TEST(ReferenceAgreement, MaskedUpperTriangleIsIgnoredAndGetsNoGradient) {
  for (Masking masking : {Masking::causal, Masking::block_causal}) {
    SCOPED_TRACE(to_string(masking));
    Case c{"masked", 1, 2, 3, 4, TokenLayout::sequence(11, 3), masking};
    Inputs in = make_inputs(c, 3);
    std::vector<double> o1(in.v.size()), o2(in.v.size());
    reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                             view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                             view(o1, c.v_shape()));
    const int64_t m = c.blocks();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = i + 1; b < m; ++b) in.w[i * m + b] = 123.0;
    reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                             view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                             view(o2, c.v_shape()));
    EXPECT_EQ(o1, o2);
    const Gradients g = block_gradients(c, in);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = i + 1; b < m; ++b) EXPECT_EQ(g.w[i * m + b], 0.0);
  }
}

// Block-causal: a token sees its whole own block (later tokens included) and
// nothing of later blocks, unlike token-level causal masking.
TEST(ReferenceAgreement, BlockCausalReadsWholeOwnBlockOnly) {
  Case c{"block-causal", 1, 1, 2, 2, TokenLayout::sequence(6, 3), Masking::block_causal};
  const Inputs in = make_inputs(c, 8);
  const auto a = reference::mhla_attention_matrix(
      c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.w, c.w_shape()), 0, 0);
  EXPECT_GT(a[0 * 6 + 2], 0.0);  // token 0 reads token 2 of its block
  EXPECT_EQ(a[2 * 6 + 3], 0.0);  // token 2 does not read token 3 (next block)
  EXPECT_GT(a[3 * 6 + 0], 0.0);  // token 3 reads the earlier block
}

// Central differences of L = sum(grad_o * o) with respect to every input entry.
class FiniteDifferences : public testing::TestWithParam<Case> {};

TEST_P(FiniteDifferences, BlockReferenceGradientsMatch) {
  const Case& c = GetParam();
  Inputs in = make_inputs(c, 11);
  const Gradients analytic = block_gradients(c, in);
  auto loss = [&]() {
    std::vector<double> o(in.v.size());
    reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                             view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                             view(o, c.v_shape()));
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * in.grad_o[i];
    return l;
  };
  auto numeric = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    const double h = 1e-6;
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss();
      x[i] = saved - h;
      const double down = loss();
      x[i] = saved;
      g[i] = (up - down) / (2 * h);
    }
    return g;
  };
  EXPECT_CLOSE(numeric(in.q), analytic.q, 1e-6, "grad q");
  EXPECT_CLOSE(numeric(in.k), analytic.k, 1e-6, "grad k");
  EXPECT_CLOSE(numeric(in.v), analytic.v, 1e-6, "grad v");
  std::vector<double> fd_w = numeric(in.w);
  if (c.masking != Masking::none &&
      c.toeplitz_length < 0) {  // the upper triangle is unused: its FD is 0 too
    const int64_t m = c.blocks();
    for (size_t e = 0; e < fd_w.size(); ++e)
      if ((int64_t(e) % (m * m)) % m > (int64_t(e) % (m * m)) / m) {
        EXPECT_EQ(fd_w[e], 0.0);
      }
  }
  EXPECT_CLOSE(fd_w, analytic.w, 1e-6, "grad w");
}

std::vector<Case> tiny_cases() {
  return with_all_modes({
      {"1d", 1, 2, 2, 3, TokenLayout::sequence(7, 3)},
      {"2d", 1, 1, 3, 2, TokenLayout::grid2d(3, 4, 2, 3)},
      {"3d", 1, 1, 2, 2, TokenLayout::grid3d(2, 3, 3, 1, 2, 2)},
  });
}

INSTANTIATE_TEST_SUITE_P(TinyShapes, FiniteDifferences, testing::ValuesIn(tiny_cases()), case_name);

}  // namespace
}  // namespace mhla::test
