// Toeplitz (relative) mixing W[i, b] = w[min(i - b, L)]: the catalogue in
// test_operator.cpp and test_references.cpp already runs it in every masked
// mode against the references; these tests tie it to the dense form it
// abbreviates and to sequences far longer than the stored distances.
#include "test_support.hpp"

namespace mhla::test {
namespace {

// The chain rule back through toeplitz_to_dense(): each w[d] collects the gradients of the
// W entries it fills.
std::vector<double> reduce(const std::vector<double>& grad_dense, int64_t copies, int64_t length,
                           int64_t m) {
  std::vector<double> g(copies * (length + 1), 0.0);
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = 0; b <= i; ++b)
        g[c * (length + 1) + std::min(i - b, length)] += grad_dense[(c * m + i) * m + b];
  return g;
}

struct Results {
  std::vector<double> o, gq, gk, gv, gw;
};

Results run_fast(const Case& c, const Inputs& in, const std::vector<double>& w) {
  Results r{std::vector<double>(in.v.size()), std::vector<double>(in.q.size()),
            std::vector<double>(in.k.size()), std::vector<double>(in.v.size()),
            std::vector<double>(w.size())};
  const Options o = c.options();
  forward<double>(o, view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
                  view(w, c.w_shape()), view(r.o, c.v_shape()));
  backward<double>(o, view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
                   view(w, c.w_shape()), view(r.o, c.v_shape()), view(in.grad_o, c.v_shape()),
                   view(r.gq, c.q_shape()), view(r.gk, c.q_shape()), view(r.gv, c.v_shape()),
                   view(r.gw, c.w_shape()));
  return r;
}

TEST(ToeplitzMixing, EqualsDenseMixingWithTheExpandedMatrix) {
  const std::vector<Case> shapes = {
      {"1d-causal", 2, 2, 4, 3, TokenLayout::sequence(45, 4), Masking::causal},
      {"1d-block-causal", 1, 3, 3, 5, TokenLayout::sequence(30, 7), Masking::block_causal},
      {"3d-block-causal", 1, 2, 4, 4, TokenLayout::grid3d(5, 4, 4, 1, 4, 2), Masking::block_causal},
  };
  for (Case c : shapes)
    for (int64_t length : {0, 1, 3, 40})
      for (bool per_head : {false, true}) {
        c.per_head = per_head;
        c.toeplitz_length = length;
        SCOPED_TRACE(c.label());
        Inputs in = make_inputs(c, 5);
        // Float-representable weights, so the float expansion below is exact.
        for (double& e : in.w) e = double(float(e));
        const Results toeplitz = run_fast(c, in, in.w);

        Case dense_case = c;
        dense_case.toeplitz_length = -1;
        const int64_t copies = per_head ? c.heads : 1, m = c.blocks();
        const std::vector<float> w32 = cast<float>(in.w);
        const std::vector<float> w_dense = toeplitz_to_dense(view(w32, c.w_shape()), m);
        const Results dense =
            run_fast(dense_case, in, std::vector<double>(w_dense.begin(), w_dense.end()));
        EXPECT_CLOSE(toeplitz.o, dense.o, 1e-12, "o");
        EXPECT_CLOSE(toeplitz.gq, dense.gq, 1e-12, "grad q");
        EXPECT_CLOSE(toeplitz.gk, dense.gk, 1e-12, "grad k");
        EXPECT_CLOSE(toeplitz.gv, dense.gv, 1e-12, "grad v");
        EXPECT_CLOSE(toeplitz.gw, reduce(dense.gw, copies, length, m), 1e-11, "grad w");
      }
}

// Hundreds of blocks with a handful of stored distances: the running tail sum
// carries everything further away.
TEST(ToeplitzMixing, LongCausalSequenceMatchesReference) {
  Case c{"1d-long", 1, 2, 3, 4, TokenLayout::sequence(1203, 4), Masking::causal};
  c.toeplitz_length = 5;
  ASSERT_EQ(c.blocks(), 301);
  const Inputs in = make_inputs(c, 8);
  const Results fast = run_fast(c, in, in.w);
  std::vector<double> o(in.v.size()), gq(in.q.size()), gk(in.k.size()), gv(in.v.size()),
      gw(in.w.size());
  reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                           view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(o, c.v_shape()));
  reference::block_backward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                            view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                            view(in.grad_o, c.v_shape()), view(gq, c.q_shape()),
                            view(gk, c.q_shape()), view(gv, c.v_shape()), view(gw, c.w_shape()));
  EXPECT_CLOSE(fast.o, o, 1e-11, "o");
  EXPECT_CLOSE(fast.gq, gq, 1e-11, "grad q");
  EXPECT_CLOSE(fast.gk, gk, 1e-11, "grad k");
  EXPECT_CLOSE(fast.gv, gv, 1e-11, "grad v");
  EXPECT_CLOSE(fast.gw, gw, 1e-10, "grad w");
}

// One w serves every length: the same parameters on 1, 10 and 1000 blocks, and
// causality means each shorter run equals the start of the longest one.
TEST(ToeplitzMixing, OneParameterVectorServesAnyLength) {
  const std::vector<float> w = {1.0f, 0.5f, 0.25f, 0.1f};
  const int64_t longest = 8000, d = 4;
  std::mt19937_64 rng(3);
  const auto x = cast<float>(uniform(longest * d, -1, 1, rng));
  auto run = [&](int64_t n) {
    Options o;
    o.masking = Masking::causal;
    o.mixing = MixingForm::toeplitz;
    o.layout = TokenLayout::sequence(n, 8);
    std::vector<float> out(n * d);
    forward<float>(o, view(x, {1, n, 1, d}), view(x, {1, n, 1, d}), view(x, {1, n, 1, d}),
                   view(w, {4}), view(out, {1, n, 1, d}));
    return out;
  };
  const std::vector<float> all = run(longest);
  for (int64_t n : {8, 80}) {
    const std::vector<float> start = run(n);
    EXPECT_CLOSE(start, std::vector<double>(all.begin(), all.begin() + n * d), 1e-6,
                 "first " + std::to_string(n) + " tokens");
  }
}

}  // namespace
}  // namespace mhla::test
