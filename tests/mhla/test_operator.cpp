// The fast CPU operator against the double-precision block reference, in fp32
// and fp64, forward and backward, on every case of the catalogue.
#include <tuple>

#include "test_support.hpp"

namespace mhla::test {
namespace {

struct Expected {
  std::vector<double> o, gq, gk, gv, gw;
};

Expected reference_results(const Case& c, const Inputs& in) {
  Expected e{std::vector<double>(in.v.size()), std::vector<double>(in.q.size()),
             std::vector<double>(in.k.size()), std::vector<double>(in.v.size()),
             std::vector<double>(in.w.size())};
  reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                           view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                           view(e.o, c.v_shape()));
  reference::block_backward(
      c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
      view(in.w, c.w_shape()), view(in.grad_o, c.v_shape()), view(e.gq, c.q_shape()),
      view(e.gk, c.q_shape()), view(e.gv, c.v_shape()), view(e.gw, c.w_shape()));
  return e;
}

template <typename T>
void check_fast_path(const Case& c, double tol) {
  const Inputs in = make_inputs(c, 2024);
  const Expected want = reference_results(c, in);
  const auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), w = cast<T>(in.w),
             g = cast<T>(in.grad_o);
  std::vector<T> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size()), gw(w.size());
  forward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
             view(w, c.w_shape()), view(o, c.v_shape()));
  EXPECT_CLOSE(o, want.o, tol, "forward");
  backward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
              view(w, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()),
              view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
              view(gw, c.w_shape()));
  EXPECT_CLOSE(gq, want.gq, tol, "grad q");
  EXPECT_CLOSE(gk, want.gk, tol, "grad k");
  EXPECT_CLOSE(gv, want.gv, tol, "grad v");
  EXPECT_CLOSE(gw, want.gw, tol, "grad w");
}

class FastOperator : public testing::TestWithParam<Case> {};

// fp32: ~1000 units of float epsilon relative to the tensor's scale; a wrong
// index or a missing term shows up as O(1).
TEST_P(FastOperator, Float32MatchesReference) { check_fast_path<float>(GetParam(), 2e-4); }
TEST_P(FastOperator, Float64MatchesReference) { check_fast_path<double>(GetParam(), 1e-11); }

INSTANTIATE_TEST_SUITE_P(AllModes, FastOperator, testing::ValuesIn(all_mode_cases()), case_name);

// Random shapes beyond the catalogue: block sizes that divide or not, several
// batches and heads, 1D causal and 2D/3D grids.
TEST(FastOperator, RandomShapes) {
  std::mt19937_64 rng(99);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 24; ++trial) {
    Case c{"random", pick(1, 2), pick(1, 3), pick(1, 24), pick(1, 24), TokenLayout()};
    switch (trial % 4) {
      case 0:
        c.layout = TokenLayout::sequence(pick(1, 150), pick(1, 40));
        break;
      case 1:
        c.layout = TokenLayout::sequence(pick(1, 150), pick(1, 40));
        c.masking = Masking::causal;
        break;
      case 2:
        c.layout = TokenLayout::grid2d(pick(1, 12), pick(1, 12), pick(1, 5), pick(1, 5));
        break;
      default:
        c.layout = TokenLayout::grid3d(pick(1, 5), pick(1, 6), pick(1, 6), pick(1, 3), pick(1, 3),
                                       pick(1, 3));
    }
    c.phi = FeatureMap(trial % 3);
    c.normalize = (trial / 3) % 2 == 0;
    c.per_head = trial % 5 == 0;
    SCOPED_TRACE(c.label() + " " + c.layout.describe());
    check_fast_path<float>(c, 2e-4);
  }
}

// Blocks large enough for the GEMMs to take their blocked code paths; the
// causal ones span several row tiles of the in-block triangle (32 rows), with
// ragged last tiles (150 = 4 x 32 + 22; a last block of 100 = 3 x 32 + 4).
TEST(FastOperator, LargerBlocks) {
  for (Masking masking : {Masking::none, Masking::causal}) {
    Case c{"large", 1, 2, 64, 48, TokenLayout::sequence(700, 96), masking};
    SCOPED_TRACE(c.label());
    check_fast_path<float>(c, 2e-4);
  }
  // Many blocks of wide summaries: dW's inner dimension Dk (Dv + 1) = 4160
  // runs in several chunks (mixer.cpp: at most 256 KiB of S^T per chunk, 1024
  // columns for 64 blocks), the causal panels over fewer columns.
  for (Masking masking : {Masking::none, Masking::causal}) {
    Case c{"many-wide", 1, 1, 64, 64, TokenLayout::sequence(512, 8), masking};
    SCOPED_TRACE(c.label());
    check_fast_path<float>(c, 2e-4);
  }
  for (int64_t toeplitz_length : {-1, 2}) {
    Case c{"wide-causal", 2, 2, 9, 7, TokenLayout::sequence(400, 150), Masking::causal};
    c.toeplitz_length = toeplitz_length;
    c.per_head = toeplitz_length < 0;
    SCOPED_TRACE(c.label());
    check_fast_path<float>(c, 2e-4);
    check_fast_path<double>(c, 1e-11);
  }
}

}  // namespace
}  // namespace mhla::test

namespace mhla::test {
namespace {

// backward() given forward's ForwardState reads the summaries and mixed
// summaries instead of recomputing them; the gradients must be bit-identical
// to recomputing them, whether the state owns its arrays or is made over the
// caller's (ForwardState::over, as the Python bindings keep them).
TEST(ForwardStateArrays, BackwardGivesIdenticalGradients) {
  for (const Case& c :
       {Case{"1d", 2, 3, 8, 5, TokenLayout::sequence(45, 8)},
        Case{"1d-causal", 1, 2, 6, 7, TokenLayout::sequence(45, 8), Masking::causal},
        Case{"1d-block-causal-toeplitz", 2, 2, 4, 3, TokenLayout::sequence(29, 4),
             Masking::block_causal, FeatureMap::elu1, true, true, 2},
        Case{"1d-causal-toeplitz", 1, 2, 5, 4, TokenLayout::sequence(31, 5), Masking::causal,
             FeatureMap::relu, false, false, 3},
        Case{"2d-per-head", 1, 2, 5, 4, TokenLayout::grid2d(7, 6, 3, 4), Masking::none,
             FeatureMap::relu, true, true}}) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 31);
    const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
               w = cast<float>(in.w), g = cast<float>(in.grad_o);
    const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
    EXPECT_EQ(ss, (std::vector<int64_t>{c.batch, c.heads, c.blocks(), c.dk, c.dv + 1}));
    std::vector<float> o(v.size()), saved(numel(ss)), mixed(numel(ss));
    ForwardState<float> owned;
    ForwardState<float> over = ForwardState<float>::over(view(saved, ss), view(mixed, ss));
    for (ForwardState<float>* state : {&owned, &over})
      forward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                     view(w, c.w_shape()), view(o, c.v_shape()), *state);
    auto run_backward = [&](const ForwardState<float>* state) {
      std::vector<float> gq(q.size()), gk(k.size()), gv(v.size()), gw(w.size());
      const auto args = std::make_tuple(
          c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
          view(w, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()), view(gq, c.q_shape()),
          view(gk, c.q_shape()), view(gv, c.v_shape()), view(gw, c.w_shape()));
      if (state == nullptr)
        std::apply([](auto&&... a) { backward<float>(a...); }, args);
      else
        std::apply([&](auto&&... a) { backward<float>(a..., *state); }, args);
      return std::vector<std::vector<float>>{gq, gk, gv, gw};
    };
    const auto recomputed = run_backward(nullptr);
    EXPECT_EQ(run_backward(&owned), recomputed);
    EXPECT_EQ(run_backward(&over), recomputed);
    // A state over the arrays forward wrote, made anew (as a binding does in
    // its backward), reads them as they are.
    const auto anew = ForwardState<float>::over(view(saved, ss), view(mixed, ss));
    EXPECT_EQ(run_backward(&anew), recomputed);
  }
}

// The arrays' layout is the documented one: block b's [S_b | z_b], row-major,
// then the mixed summaries each query block reads, sum_b W[i,b] S_b.
TEST(ForwardStateArrays, HoldBlockAndMixedSummaries) {
  Case c{"1d", 1, 1, 2, 3, TokenLayout::sequence(5, 2), Masking::none, FeatureMap::identity};
  const Inputs in = make_inputs(c, 5);
  const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
             w = cast<float>(in.w);
  const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  std::vector<float> o(v.size()), saved(numel(ss)), mixed(numel(ss));
  auto state = ForwardState<float>::over(view(saved, ss), view(mixed, ss));
  forward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(o, c.v_shape()), state);
  // Block 1 holds tokens 2 and 3 (Dk = 2, Dv = 3: rows of 4 = [S row | z]).
  for (int r = 0; r < 2; ++r) {
    for (int e = 0; e < 3; ++e)
      EXPECT_NEAR(saved[(1 * 2 + r) * 4 + e],
                  in.k[2 * 2 + r] * in.v[2 * 3 + e] + in.k[3 * 2 + r] * in.v[3 * 3 + e], 1e-6);
    EXPECT_NEAR(saved[(1 * 2 + r) * 4 + 3], in.k[2 * 2 + r] + in.k[3 * 2 + r], 1e-6);
  }
  const int64_t m = c.blocks(), x = 2 * 4;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t e = 0; e < x; ++e) {
      double want = 0;
      for (int64_t b = 0; b < m; ++b) want += in.w[i * m + b] * saved[b * x + e];
      EXPECT_NEAR(mixed[i * x + e], want, 1e-5) << "block " << i << ", entry " << e;
    }
}

TEST(ForwardStateArrays, AStateOverArraysOfTheWrongShapeIsRejected) {
  Case c{"1d", 1, 2, 4, 3, TokenLayout::sequence(8, 4)};
  const Inputs in = make_inputs(c, 1);
  const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
             w = cast<float>(in.w);
  std::vector<float> o(v.size()), small(100), fits(16 * 2);
  auto run = [&](TensorView<float> summaries, TensorView<float> mixed) {
    auto state = ForwardState<float>::over(summaries, mixed);
    forward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                   view(w, c.w_shape()), view(o, c.v_shape()), state);
  };
  EXPECT_THAT(
      [&] {
        run(view(small, {1, 2, 2, 4, 3}), view(fits, {1, 2, 2, 4, 4}));
      },
      testing::ThrowsMessage<Error>(testing::HasSubstr(
          "the state's summaries has shape [1, 2, 2, 4, 3], expected [1, 2, 2, 4, 4]")));
  EXPECT_THAT(
      [&] {
        run(view(fits, {1, 2, 2, 4, 4}), view(small, {1, 2, 2, 4, 3}));
      },
      testing::ThrowsMessage<Error>(testing::HasSubstr(
          "the state's mixed summaries has shape [1, 2, 2, 4, 3], expected [1, 2, 2, 4, 4]")));
  EXPECT_THROW(saved_summaries_shape(c.options(), {1, 9, 2, 4}, {1, 9, 2, 3}), Error);
}

}  // namespace
}  // namespace mhla::test
