// The bfloat16 operator (bfloat16 q, k, v, o and gradients; float32 w, grad_w
// and saved arrays) against the float64 operator on the same inputs (rounded
// to bfloat16 once), on the catalogue of modes and awkward shapes: its block
// products on bfloat16 operands where the CPU has AVX512-BF16, the float
// kernels on widened copies elsewhere (pinned below AVX-512) and in causal
// mode. Bit-identical across thread counts; saved summaries round-trip and
// foreign ones are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/isa.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

using Bf16Results = HalfResults<bfloat16>;

// forward (keeping the summaries when `save`) then backward, on `threads` threads.
Bf16Results run_bf16(const Case& c, const Inputs& in, int threads, bool save = true) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  Bf16Results r = run_half<bfloat16>(c, in, rounded_to_bfloat16, save);
  omp_set_num_threads(before);
  return r;
}

// The float64 operator on the inputs as the bfloat16 call sees them.
Inputs as_rounded(const Inputs& in) {
  Inputs r = in;
  r.q = bfloat16_values(rounded_to_bfloat16(in.q)),
  r.k = bfloat16_values(rounded_to_bfloat16(in.k)),
  r.v = bfloat16_values(rounded_to_bfloat16(in.v));
  r.grad_o = bfloat16_values(rounded_to_bfloat16(in.grad_o));
  for (double& x : r.w) x = float(x);
  return r;
}

// The float64 gradients at the o the bfloat16 call returned (the backward's
// contract: gradients given o; in modes whose gradient cancels, rounding o
// alone moves them far more than the backward's own arithmetic does).
OperatorResults<double> double_gradients_at(const Case& c, const Inputs& in,
                                            const std::vector<double>& o) {
  OperatorResults<double> r{o, std::vector<double>(in.q.size()), std::vector<double>(in.k.size()),
                            std::vector<double>(in.v.size()), std::vector<double>(in.w.size())};
  backward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                   view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(o, c.v_shape()),
                   view(in.grad_o, c.v_shape()), view(r.gq, c.q_shape()), view(r.gk, c.q_shape()),
                   view(r.gv, c.v_shape()), view(r.gw, c.w_shape()));
  return r;
}

// Tolerances in units of the tensor's scale (test_support.hpp's
// relative_error). bfloat16 keeps 8 significant bits: 2^-8 = 0.0039 is half
// a unit in the last place. Largest errors measured on the catalogue (Zen 5,
// bfloat16 products), with the summaries saved or recomputed: o 0.0074 (o is
// rounded once; phi(q), phi(k), S~ and, in the bfloat16 mix, the summaries
// and w once more in the products); grad_q 0.011 (its two normalised terms
// cancel: see ChunkedAttention::output_gradients); grad_v 0.0081; grad_k
// 0.015 and grad_w 0.054 (their products on bfloat16 operands feed sums that
// cancel: the ones' column against V in dphi(K), dmixed_i against S_b over
// Dk (Dv + 1) terms in dW). On the paper's setting (elu+1, normalised) the
// errors are 0.37-1.21x those of the same formula computed in bfloat16
// (python/tests/test_reduced_precision.py).
constexpr double kOutputTolerance = 0.015;
constexpr double kGradientTolerance = 0.04;
constexpr double kGradWTolerance = 0.09;

void expect_matches_double(const Case& c, const Inputs& in, const Bf16Results& got,
                           const OperatorResults<double>& want) {
  const Inputs exact_in = as_rounded(in);
  const OperatorResults<double> grads = double_gradients_at(c, exact_in, bfloat16_values(got.o));
  EXPECT_CLOSE(bfloat16_values(got.o), want.o, kOutputTolerance, "o");
  EXPECT_CLOSE(bfloat16_values(got.gq), grads.gq, kGradientTolerance, "grad_q");
  EXPECT_CLOSE(bfloat16_values(got.gk), grads.gk, kGradientTolerance, "grad_k");
  EXPECT_CLOSE(bfloat16_values(got.gv), grads.gv, kGradientTolerance, "grad_v");
  EXPECT_CLOSE(got.gw, grads.gw, kGradWTolerance, "grad_w");
}

TEST(Bfloat16, MatchesTheDoublePrecisionOperator) {
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 3);
    const OperatorResults<double> want = run_operator<double>(c, as_rounded(in), 1);
    for (bool save : {true, false}) {
      SCOPED_TRACE(save ? "summaries saved" : "summaries recomputed");
      expect_matches_double(c, in, run_bf16(c, in, 1, save), want);
    }
  }
}

// Heads wide enough for dW's inner dimension Dk (Dv + 1) to run in several
// chunks on bfloat16 products (an odd one, whose last pair is padded), and
// enough blocks for two column panels per slice (masked rows too): against
// float64, and bit for bit across thread counts.
TEST(Bfloat16, WideHeadsMatchTheDoublePrecisionOperator) {
  for (const Case& c : {Case{"wide-ragged", 2, 2, 63, 72, TokenLayout::sequence(70 * 8 + 3, 8)},
                        Case{"wide-block-causal", 1, 2, 64, 64, TokenLayout::sequence(600, 8),
                             Masking::block_causal}}) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 9);
    const Bf16Results one = run_bf16(c, in, 1);
    expect_matches_double(c, in, one, run_operator<double>(c, as_rounded(in), 1));
    EXPECT_TRUE(one == run_bf16(c, in, 2)) << "2 threads differ from 1";
    EXPECT_TRUE(one == run_bf16(c, in, 3)) << "3 threads differ from 1";
  }
}

// Pinned below AVX-512 the products are off and forward widens its inputs
// for the float kernels: the same accuracy, and within rounding of the
// bfloat16 products.
TEST(Bfloat16, TheWidenedFloatPathAgrees) {
  const std::vector<int64_t> targets = cpu::simd::runnable_targets();
  const auto lesser = std::find_if(targets.begin(), targets.end(), [](int64_t t) {
    cpu::simd::pin_target(t);
    const bool below = !cpu::simd::active_target_is_avx512();
    cpu::simd::pin_target(0);
    return below;
  });
  ASSERT_NE(lesser, targets.end()) << "no target below AVX-512 to pin";
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 4);
    const OperatorResults<double> want = run_operator<double>(c, as_rounded(in), 1);
    const Bf16Results best = run_bf16(c, in, 1);
    cpu::simd::pin_target(*lesser);
    ASSERT_FALSE(cpu::simd::bf16_products_available());
    const Bf16Results widened_path = run_bf16(c, in, 1);
    cpu::simd::pin_target(0);
    expect_matches_double(c, in, widened_path, want);
    EXPECT_CLOSE(bfloat16_values(widened_path.o), bfloat16_values(best.o), kOutputTolerance,
                 "o, both paths");
  }
}

// The bfloat16 forward's o, with or without a state keeping the summaries
// and the mixed summaries.
std::vector<bfloat16> bf16_output(const Case& c, const Inputs& in, bool keep) {
  const auto q = rounded_to_bfloat16(in.q), k = rounded_to_bfloat16(in.k),
             v = rounded_to_bfloat16(in.v);
  const auto w = cast<float>(in.w);
  std::vector<bfloat16> o(v.size());
  ForwardState<float> state;
  if (keep)
    forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
            view(w, c.w_shape()), view(o, c.v_shape()), state);
  else
    forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
            view(w, c.w_shape()), view(o, c.v_shape()));
  return o;
}

// Training and inference see the same o: the mix runs on bfloat16 products
// whether or not forward keeps its arrays for backward.
TEST(Bfloat16, KeepingTheSummariesLeavesOUnchanged) {
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 8);
    const std::vector<bfloat16> plain = bf16_output(c, in, false), kept = bf16_output(c, in, true);
    EXPECT_EQ(std::memcmp(kept.data(), plain.data(), plain.size() * sizeof(bfloat16)), 0)
        << "o differs keeping the summaries";
  }
}

TEST(Bfloat16, RepeatsBitForBitAcrossThreadCounts) {
  for (const Case& c :
       {Case{"1d-ragged", 2, 3, 24, 33, TokenLayout::sequence(700, 30)},
        Case{"1d-causal", 1, 2, 17, 40, TokenLayout::sequence(500, 16), Masking::causal},
        Case{"2d", 1, 3, 16, 16, TokenLayout::grid2d(30, 31, 4, 4)}}) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 5);
    for (bool save : {true, false}) {
      const Bf16Results one = run_bf16(c, in, 1, save);
      EXPECT_TRUE(one == run_bf16(c, in, 1, save)) << "a second run differs";
      EXPECT_TRUE(one == run_bf16(c, in, 2, save)) << "2 threads differ from 1";
      EXPECT_TRUE(one == run_bf16(c, in, 3, save)) << "3 threads differ from 1";
    }
  }
}

TEST(Bfloat16, AStateKeptForOtherKeysIsRefused) {
  const Case c{"1d", 1, 2, 8, 8, TokenLayout::sequence(64, 16)};
  const Inputs in = make_inputs(c, 6), other = make_inputs(c, 7);
  const auto q = rounded_to_bfloat16(in.q), k = rounded_to_bfloat16(in.k),
             v = rounded_to_bfloat16(in.v), g = rounded_to_bfloat16(in.grad_o);
  const auto k2 = rounded_to_bfloat16(other.k);
  const auto w = cast<float>(in.w);
  std::vector<bfloat16> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size());
  std::vector<float> gw(w.size());
  ForwardState<float> state;
  forward(c.options(), view(q, c.q_shape()), view(k2, c.q_shape()), view(v, c.v_shape()),
          view(w, c.w_shape()), view(o, c.v_shape()), state);
  EXPECT_THAT(
      [&] {
        backward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(std::as_const(o), c.v_shape()), view(g, c.v_shape()),
                 view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                 view(gw, c.w_shape()), state);
      },
      testing::ThrowsMessage<Error>(testing::HasSubstr(
          "mhla::backward: k is not the tensor that the forward() which filled state read")));
}

TEST(Bfloat16, BadArgumentsAreNamed) {
  const Case c{"1d", 1, 2, 8, 8, TokenLayout::sequence(64, 16)};
  const Inputs in = make_inputs(c, 8);
  const auto q = rounded_to_bfloat16(in.q), k = rounded_to_bfloat16(in.k),
             v = rounded_to_bfloat16(in.v), g = rounded_to_bfloat16(in.grad_o);
  const auto w = cast<float>(in.w);
  std::vector<bfloat16> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size());
  std::vector<float> gw(w.size());
  using testing::HasSubstr;
  using testing::ThrowsMessage;
  EXPECT_THAT(
      [&] {
        forward(c.options(), TensorView<const bfloat16>{nullptr, c.q_shape()}, view(k, c.q_shape()),
                view(v, c.v_shape()), view(w, c.w_shape()), view(o, c.v_shape()));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::forward: q")));
  EXPECT_THAT(
      [&] {
        forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                view(w, {2, 2}), view(o, c.v_shape()));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::forward: w has shape [2, 2], expected [4, 4]")));
  EXPECT_THAT(
      [&] {
        forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                view(w, c.w_shape()), view(o, {1, 64, 2, 7}));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::forward: o has shape [1, 64, 2, 7]")));
  EXPECT_THAT(
      [&] {
        backward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(std::as_const(o), c.v_shape()), view(g, c.v_shape()),
                 view(gq, {1, 64, 2, 9}), view(gk, c.q_shape()), view(gv, c.v_shape()),
                 view(gw, c.w_shape()));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::backward: grad_q has shape [1, 64, 2, 9]")));
}

// A zero denominator from finite bfloat16 inputs is named, as in float.
TEST(Bfloat16, ZeroDenominatorsAreNamedErrors) {
  Options options;
  options.layout = TokenLayout::sequence(8, 8);
  options.feature_map = FeatureMap::relu;
  options.eps = 0;
  const std::vector<int64_t> shape = {1, 8, 1, 2};
  const std::vector<bfloat16> negative(16, to_bfloat16(-1.0f)), ones(16, to_bfloat16(1.0f));
  const std::vector<float> w = {1.0f};
  std::vector<bfloat16> o(16);
  EXPECT_THAT(
      [&] {
        forward(options, view(negative, shape), view(negative, shape), view(ones, shape),
                view(w, {1, 1}), view(o, shape));
      },
      testing::ThrowsMessage<Error>(
          testing::AllOf(testing::HasSubstr("zero denominator"), testing::HasSubstr("eps = 0"))));
}

}  // namespace
}  // namespace mhla::test
