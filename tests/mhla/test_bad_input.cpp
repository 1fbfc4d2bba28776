// Regression tests for inputs that once crashed, hung or came back as silent
// garbage: non-finite results from finite input, summaries saved by another
// forward call, oversized mixing matrices and allocations that cannot be had.
#include <cstdlib>
#include <limits>

#include "core/validate.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;
using testing::ThrowsMessage;

// One head, one block: q, k [1, N, 1, Dk], v [1, N, 1, Dv] filled with given
// values; identity features unless a test sets another map.
template <typename T>
struct Tiny {
  Options options;
  std::vector<T> q, k, v, w = {T(1)}, o;
  std::vector<int64_t> qs, vs;

  Tiny(int64_t n, int64_t dk, int64_t dv, T qv, T kv, T vv) {
    options.layout = TokenLayout::sequence(n, n);
    options.feature_map = FeatureMap::identity;
    qs = {1, n, 1, dk};
    vs = {1, n, 1, dv};
    q.assign(size_t(n * dk), qv);
    k.assign(size_t(n * dk), kv);
    v.assign(size_t(n * dv), vv);
    o.assign(size_t(n * dv), T(0));
  }
  void forward() {
    mhla::forward<T>(options, view(q, qs), view(k, qs), view(v, vs), view(w, {1, 1}), view(o, vs));
  }
};

TEST(BadInput, Float32OverflowIsANamedErrorWhileFloat64IsFinite) {
  // elu+1 features of 1e19 give phi(q)^T S~ ~ 1e38 * Dk: beyond float32's range,
  // although the normalized output (about v) is representable.
  Tiny<float> f(16, 4, 4, 1e19f, 1e19f, 0.5f);
  f.options.feature_map = FeatureMap::elu1;
  EXPECT_THAT([&] { f.forward(); },
              ThrowsMessage<Error>(AllOf(HasSubstr("mhla::forward: o[0, 0, 0, 0]"),
                                         HasSubstr("is not finite although every input is finite"),
                                         HasSubstr("|q| <= 1e+19"), HasSubstr("overflows float32"),
                                         HasSubstr("compute in float64"))));
  // With small v only the denominator overflows; the output would be a silent 0.
  Tiny<float> small_v(16, 4, 4, 1e19f, 1e19f, 1e-3f);
  small_v.options.feature_map = FeatureMap::elu1;
  EXPECT_THAT([&] { small_v.forward(); },
              ThrowsMessage<Error>(
                  HasSubstr("mhla::forward: the read-out's denominator phi(q)^T z~ + eps is not "
                            "finite although every input is finite")));
  Tiny<double> d(16, 4, 4, 1e19, 1e19, 0.5);
  d.options.feature_map = FeatureMap::elu1;
  d.forward();
  for (double x : d.o) EXPECT_NEAR(x, 0.5, 1e-12);
}

TEST(BadInput, ZeroDenominatorsAreNamedErrors) {
  // eps = 0 and relu features that are all zero: 0 / 0.
  Tiny<float> relu(8, 2, 3, -1.0f, -1.0f, 1.0f);
  relu.options.feature_map = FeatureMap::relu;
  relu.options.eps = 0;
  EXPECT_THAT([&] { relu.forward(); },
              ThrowsMessage<Error>(AllOf(HasSubstr("zero denominator"), HasSubstr("eps = 0"),
                                         HasSubstr("or use eps > 0"))));
  // With eps > 0 the same input is defined: o = 0.
  relu.options.eps = 1e-6;
  relu.forward();
  for (float x : relu.o) EXPECT_EQ(x, 0.0f);

  // Identity features whose signed key sums cancel exactly: phi(q)^T z = 0.
  Tiny<double> id(2, 1, 1, 1.0, 1.0, 1.0);
  id.k = {1.0, -1.0};
  id.options.eps = 0;
  EXPECT_THAT([&] { id.forward(); },
              ThrowsMessage<Error>(AllOf(HasSubstr("identity feature map's signed sums"),
                                         HasSubstr("use a positive feature map"))));
}

TEST(BadInput, SubnormalDenominatorsAreNamedErrors) {
  // relu features near 1e-20 multiply to about 1e-40, below float32's normal
  // range: the denominator's reciprocal overflows and its precision is lost.
  Tiny<float> tiny(8, 2, 3, 1e-20f, 1e-20f, 1.0f);
  tiny.options.feature_map = FeatureMap::relu;
  tiny.options.eps = 0;
  EXPECT_THAT([&] { tiny.forward(); },
              ThrowsMessage<Error>(AllOf(HasSubstr("mhla::forward: o[0, 0, 0, 0] = inf"),
                                         HasSubstr("or one below float32's normal range, whose "
                                                   "reciprocal overflows"))));
  // Scaled into the normal range, the same call is defined (o = v).
  tiny.q.assign(tiny.q.size(), 1e-10f);
  tiny.k.assign(tiny.k.size(), 1e-10f);
  tiny.forward();
  for (float x : tiny.o) EXPECT_FLOAT_EQ(x, 1.0f);
}

TEST(BadInput, SoftmaxScoresBeyondTheRangeAreNamed) {
  // |q| |k| scale near 1e38: the exact rows are one-hot, but the scores and
  // the log-sum-exp that backward reads are beyond float32.
  const std::vector<int64_t> qs = {1, 4, 1, 2};
  std::vector<float> q = {3e19f, 3e19f, -3e19f, 3e19f, 3e19f, -3e19f, -3e19f, -3e19f};
  std::vector<float> v(8, 0.5f), o(8), lse(4);
  const auto call = [&] {
    softmax_attention_forward<float>({}, view(q, qs), view(q, qs), view(v, qs), view(o, qs),
                                     view(lse, {1, 1, 4}));
  };
  EXPECT_THAT(call, ThrowsMessage<Error>(
                        AllOf(HasSubstr("mhla::softmax_attention_forward: the result is not finite "
                                        "although every input is finite (|q| <= 3e+19"),
                              HasSubstr("the scores q k^T * scale overflow float32"))));
  for (float& x : q) x *= 1e-18f;
  call();
  for (float x : o) EXPECT_FLOAT_EQ(x, 0.5f);
}

TEST(BadInput, NonFiniteGradientsFromFiniteInputAreNamedErrors) {
  // den = 1e-200 (finite), o = 1; grad_o = 1e200 gives dy = grad_o / den = inf.
  Tiny<double> t(1, 1, 1, 1e-200, 1.0, 1.0);
  t.options.eps = 0;
  t.forward();
  ASSERT_EQ(t.o[0], 1.0);
  std::vector<double> g = {1e200}, gq(1), gk(1), gv(1), gw(1);
  EXPECT_THAT(
      [&] {
        backward<double>(t.options, view(t.q, t.qs), view(t.k, t.qs), view(t.v, t.vs),
                         view(t.w, {1, 1}), view(t.o, t.vs), view(g, t.vs), view(gq, t.qs),
                         view(gk, t.qs), view(gv, t.vs), view(gw, {1, 1}));
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("mhla::backward: grad_"), HasSubstr("not finite"))));
}

TEST(BadInput, NonFiniteInputPropagatesWithoutError) {
  Tiny<float> t(8, 2, 2, 0.5f, 0.5f, 0.5f);
  t.v[3] = std::numeric_limits<float>::quiet_NaN();
  t.forward();  // IEEE propagation, as in any tensor library: no error
  EXPECT_TRUE(std::any_of(t.o.begin(), t.o.end(), [](float x) { return std::isnan(x); }));
}

TEST(BadInput, LinearAttentionAndDecoderNameNonFiniteResultsToo) {
  Tiny<float> t(16, 4, 4, 1e19f, 1e19f, 0.5f);
  LinearAttentionOptions lin;
  lin.feature_map = FeatureMap::elu1;
  EXPECT_THAT(
      [&] {
        linear_attention_forward<float>(lin, view(t.q, t.qs), view(t.k, t.qs), view(t.v, t.vs),
                                        view(t.o, t.vs));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::linear_attention_forward: o[")));

  DecoderOptions d;
  d.heads = 1, d.dk = 4, d.dv = 4, d.block = 4, d.feature_map = FeatureMap::elu1;
  const std::vector<float> w = {1.0f};
  Decoder decoder(d, view(w, {1, 1}));
  std::vector<float> q(4, 1e19f), v(4, 0.5f), o(4);
  EXPECT_THAT(
      [&] {
        decoder.step(view(q, {1, 1, 1, 4}), view(q, {1, 1, 1, 4}), view(v, {1, 1, 1, 4}),
                     view(o, {1, 1, 1, 4}));
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("mhla::Decoder::step: "),
                                 HasSubstr("is not finite although every input is finite"),
                                 HasSubstr("reset the sequence"))));
}

TEST(BadInput, SummariesSavedForOtherInputsAreRejected) {
  for (const Case& c : {Case{"1d", 2, 2, 3, 4, TokenLayout::sequence(13, 4), Masking::causal},
                        Case{"2d", 1, 3, 2, 2, TokenLayout::grid2d(5, 6, 2, 3)}}) {
    SCOPED_TRACE(c.label());
    const Inputs a = make_inputs(c, 1), b = make_inputs(c, 2);
    const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
    std::vector<double> o(a.v.size()), saved(size_t(numel(ss)));
    forward<double>(c.options(), view(a.q, c.q_shape()), view(a.k, c.q_shape()),
                    view(a.v, c.v_shape()), view(a.w, c.w_shape()), view(o, c.v_shape()),
                    view(saved, ss));
    std::vector<double> gq(a.q.size()), gk(a.k.size()), gv(a.v.size()), gw(a.w.size());
    auto run_backward = [&](const Inputs& in) {
      backward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                       view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(o, c.v_shape()),
                       view(a.grad_o, c.v_shape()), view(gq, c.q_shape()), view(gk, c.q_shape()),
                       view(gv, c.v_shape()), view(gw, c.w_shape()), view(saved, ss));
    };
    EXPECT_NO_THROW(run_backward(a));
    EXPECT_THAT([&] { run_backward(b); },
                ThrowsMessage<Error>(AllOf(
                    HasSubstr("mhla::backward: saved_summaries do not belong to these k and v"),
                    HasSubstr("pass the summaries that forward() saved"))));
    // Only v differs: the row sums of S_b catch it.
    Inputs v_only = a;
    v_only.v = b.v;
    EXPECT_THROW(run_backward(v_only), Error);
  }
}

// Mixed summaries depend on w too: a w changed since forward (an optimizer
// step in between), or other k or v, is caught in every mode of the mix.
TEST(BadInput, MixedSummariesSavedForOtherInputsAreRejected) {
  for (const Case& c : {Case{"1d", 2, 2, 3, 4, TokenLayout::sequence(13, 4), Masking::causal},
                        Case{"2d-per-head", 1, 3, 2, 2, TokenLayout::grid2d(5, 6, 2, 3),
                             Masking::none, FeatureMap::elu1, true, true},
                        Case{"1d-toeplitz", 1, 2, 3, 3, TokenLayout::sequence(17, 3),
                             Masking::block_causal, FeatureMap::relu, true, false, 2}}) {
    SCOPED_TRACE(c.label());
    const Inputs a = make_inputs(c, 1), b = make_inputs(c, 2);
    const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
    std::vector<double> o(a.v.size()), mixed(size_t(numel(ss)));
    forward<double>(c.options(), view(a.q, c.q_shape()), view(a.k, c.q_shape()),
                    view(a.v, c.v_shape()), view(a.w, c.w_shape()), view(o, c.v_shape()), {},
                    view(mixed, ss));
    std::vector<double> gq(a.q.size()), gk(a.k.size()), gv(a.v.size()), gw(a.w.size());
    auto run_backward = [&](const Inputs& in) {
      backward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                       view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(o, c.v_shape()),
                       view(a.grad_o, c.v_shape()), view(gq, c.q_shape()), view(gk, c.q_shape()),
                       view(gv, c.v_shape()), view(gw, c.w_shape()), {}, view(mixed, ss));
    };
    EXPECT_NO_THROW(run_backward(a));
    Inputs stepped = a;  // w after a small optimizer step
    for (double& x : stepped.w) x *= 1.01;
    EXPECT_THAT([&] { run_backward(stepped); },
                ThrowsMessage<Error>(AllOf(
                    HasSubstr("mhla::backward: saved_mixed does not belong to these k, v and w"),
                    HasSubstr("pass the mixed summaries that forward() saved"))));
    Inputs k_only = a, v_only = a;
    k_only.k = b.k;
    v_only.v = b.v;
    EXPECT_THROW(run_backward(k_only), Error);
    EXPECT_THROW(run_backward(v_only), Error);
  }
}

// Handed both saved arrays (as the torch layers pass them), backward takes the
// mixed summaries' fingerprint from the saved summaries and w instead of a pass
// over k and v: a changed w is still caught, in float32 as in float64, and
// matching arrays pass in every mode of the mix.
template <typename T>
void check_both_saved(const Case& c) {
  SCOPED_TRACE(c.label());
  const Inputs a = make_inputs(c, 1), b = make_inputs(c, 2);
  const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  const auto q = cast<T>(a.q), k = cast<T>(a.k), v = cast<T>(a.v), w = cast<T>(a.w),
             g = cast<T>(a.grad_o), other_k = cast<T>(b.k);
  std::vector<T> stepped_w = w;
  for (T& x : stepped_w) x *= T(1.01);
  std::vector<T> o(v.size()), summaries(size_t(numel(ss))), mixed(summaries.size());
  std::vector<T> stale_o(v.size()), stale_summaries(summaries.size()), stale_mixed(mixed.size());
  auto forward_saving = [&](const std::vector<T>& with_w, std::vector<T>& out, std::vector<T>& s,
                            std::vector<T>& mx) {
    forward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
               view(with_w, c.w_shape()), view(out, c.v_shape()), view(s, ss), view(mx, ss));
  };
  forward_saving(w, o, summaries, mixed);
  forward_saving(stepped_w, stale_o, stale_summaries, stale_mixed);
  std::vector<T> gq(q.size()), gk(k.size()), gv(v.size()), gw(w.size());
  auto run_backward = [&](const std::vector<T>& with_k, const std::vector<T>& with_w,
                          const std::vector<T>& mx) {
    backward<T>(c.options(), view(q, c.q_shape()), view(with_k, c.q_shape()), view(v, c.v_shape()),
                view(with_w, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()),
                view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                view(gw, c.w_shape()), view(summaries, ss), view(mx, ss));
  };
  EXPECT_NO_THROW(run_backward(k, w, mixed));
  const auto names_mixed = ThrowsMessage<Error>(
      HasSubstr("mhla::backward: saved_mixed does not belong to these k, v and w"));
  EXPECT_THAT([&] { run_backward(k, stepped_w, mixed); }, names_mixed);
  // Mixed summaries of the same summaries under another w.
  EXPECT_THAT([&] { run_backward(k, w, stale_mixed); }, names_mixed);
  EXPECT_THAT([&] { run_backward(other_k, w, mixed); },
              ThrowsMessage<Error>(
                  HasSubstr("mhla::backward: saved_summaries do not belong to these k and v")));
}

TEST(BadInput, MixedSummariesAreCheckedAgainstTheSavedSummaries) {
  for (const Case& c : {Case{"1d", 2, 2, 3, 4, TokenLayout::sequence(13, 4), Masking::causal},
                        Case{"1d-many", 1, 2, 8, 8, TokenLayout::sequence(300, 7)},
                        Case{"2d-per-head", 1, 3, 2, 2, TokenLayout::grid2d(5, 6, 2, 3),
                             Masking::none, FeatureMap::elu1, true, true},
                        Case{"1d-toeplitz", 1, 2, 3, 3, TokenLayout::sequence(17, 3),
                             Masking::block_causal, FeatureMap::relu, true, false, 2}}) {
    check_both_saved<float>(c);
    check_both_saved<double>(c);
  }
}

// relu features with feature 0 of block 1 all zero,
// so a fingerprint of entry 0 alone cannot see that W[0, 1] changed.
TEST(BadInput, StaleMixedSummariesWithAZeroFeatureAreRejected) {
  Case c{"1d", 1, 1, 3, 4, TokenLayout::sequence(8, 4), Masking::none, FeatureMap::relu};
  Inputs a = make_inputs(c, 0);
  for (auto& x : a.q) x = std::abs(x);
  for (auto& x : a.k) x = std::abs(x);
  for (auto& x : a.v) x = std::abs(x);
  for (int64_t t = 4; t < 8; ++t) a.k[size_t(t * 3)] = -1.0;
  a.w = {0.6, 0.4, 0.3, 0.7};
  const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  std::vector<double> o(a.v.size()), summaries(size_t(numel(ss))), mixed(summaries.size());
  forward<double>(c.options(), view(a.q, c.q_shape()), view(a.k, c.q_shape()),
                  view(a.v, c.v_shape()), view(a.w, c.w_shape()), view(o, c.v_shape()),
                  view(summaries, ss), view(mixed, ss));
  std::vector<double> gq(a.q.size()), gk(a.k.size()), gv(a.v.size()), gw(a.w.size());
  auto run = [&](const Inputs& in, bool with_summaries, bool with_mixed) {
    backward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                     view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(o, c.v_shape()),
                     view(in.grad_o, c.v_shape()), view(gq, c.q_shape()), view(gk, c.q_shape()),
                     view(gv, c.v_shape()), view(gw, c.w_shape()),
                     with_summaries ? view(summaries, ss) : TensorView<const double>{},
                     with_mixed ? view(mixed, ss) : TensorView<const double>{});
  };
  EXPECT_NO_THROW(run(a, true, true));
  Inputs stepped = a;
  stepped.w[1] = 0.9;  // an optimizer step between forward and backward
  EXPECT_THAT([&] { run(stepped, true, true); },
              ThrowsMessage<Error>(HasSubstr("saved_mixed does not belong to these k, v and w")));
  Inputs one_v = a;
  one_v.v[5] += 0.5;
  EXPECT_THAT([&] { run(one_v, false, true); },
              ThrowsMessage<Error>(HasSubstr("saved_mixed does not belong to these k, v and w")));
}

// Every block is checked: one element of k or v changed in any block, two v
// elements of one row swapped, or any one entry of w moved by 1%, is caught,
// in float32 and float64, in every masking mode.
template <typename T>
void check_every_block(const Case& c) {
  SCOPED_TRACE(c.label());
  Inputs a = make_inputs(c, 7);
  // relu features of negative keys are 0, and so is their v's share of S_b:
  // positive keys make every element count.
  if (c.phi == FeatureMap::relu)
    for (double& x : a.k) x = std::abs(x);
  const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  const auto q = cast<T>(a.q), k = cast<T>(a.k), v = cast<T>(a.v), w = cast<T>(a.w),
             g = cast<T>(a.grad_o);
  std::vector<T> o(v.size()), summaries(size_t(numel(ss))), mixed(summaries.size());
  forward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
             view(w, c.w_shape()), view(o, c.v_shape()), view(summaries, ss), view(mixed, ss));
  std::vector<T> gq(q.size()), gk(k.size()), gv(v.size()), gw(w.size());
  // Which saved array is handed in: 1 summaries, 2 mixed, 3 both.
  auto rejected = [&](const std::vector<T>& kk, const std::vector<T>& vv, const std::vector<T>& ww,
                      int saved) {
    try {
      backward<T>(c.options(), view(q, c.q_shape()), view(kk, c.q_shape()), view(vv, c.v_shape()),
                  view(ww, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()),
                  view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                  view(gw, c.w_shape()), saved & 1 ? view(summaries, ss) : TensorView<const T>{},
                  saved & 2 ? view(mixed, ss) : TensorView<const T>{});
    } catch (const Error& e) {
      return std::string(e.what()).find("does not belong to these") != std::string::npos ||
             std::string(e.what()).find("do not belong to these") != std::string::npos;
    }
    return false;
  };
  for (int saved : {1, 2, 3}) EXPECT_FALSE(rejected(k, v, w, saved)) << "saved " << saved;
  const int64_t h = c.heads, dk = c.dk, dv = c.dv;
  for (int64_t blk = 0; blk < c.blocks(); ++blk) {
    // The last token of the block, in head h - 1, batch 0.
    int64_t t = -1;
    for (int64_t s = 0; s < c.tokens(); ++s)
      if (c.layout.block_of(s) == blk) t = s;
    const size_t kr = size_t((t * h + h - 1) * dk), vr = size_t((t * h + h - 1) * dv);
    std::vector<T> k2 = k, v2 = v, v3 = v;
    k2[kr + size_t(dk - 1)] += T(0.25);  // phi moves: every map is increasing there
    v2[vr] += T(0.25);
    if (dv > 1) std::swap(v3[vr], v3[vr + 1]);
    // Causal masking mixes only earlier blocks: the last block's summary is
    // in no mixed summary, which a change there leaves as they were.
    const bool mixed_reads = !(c.masking == Masking::causal && blk == c.blocks() - 1);
    for (int saved : {1, 2}) {
      if (saved == 2 && !mixed_reads) continue;
      EXPECT_TRUE(rejected(k2, v, w, saved)) << "k in block " << blk << ", saved " << saved;
      EXPECT_TRUE(rejected(k, v2, w, saved)) << "v in block " << blk << ", saved " << saved;
      if (dv > 1 && v3 != v) {
        EXPECT_TRUE(rejected(k, v3, w, saved)) << "v swapped in block " << blk;
      }
    }
  }
  for (size_t e = 0; e < w.size(); ++e) {
    std::vector<T> w2 = w;
    w2[e] *= T(1.01);
    // Entries the mix never reads (above the diagonal; causal: the diagonal
    // too, which acts inside the block) change no mixed summary.
    const int64_t m = c.blocks(), row = int64_t(e) % (m * m) / m, col = int64_t(e) % m;
    const bool read = c.toeplitz_length >= 0 || c.masking == Masking::none ||
                      (c.masking == Masking::block_causal && col <= row) ||
                      (c.masking == Masking::causal && col < row);
    if (read) {
      EXPECT_TRUE(rejected(k, v, w2, 3)) << "w entry " << e;
    }
  }
}

TEST(BadInput, StaleSavedStateIsCaughtInEveryBlock) {
  for (const Case& c : {Case{"1d", 1, 2, 3, 4, TokenLayout::sequence(23, 4)},
                        Case{"1d-causal", 1, 2, 4, 3, TokenLayout::sequence(19, 4), Masking::causal,
                             FeatureMap::relu},
                        Case{"2d-per-head", 2, 2, 3, 2, TokenLayout::grid2d(5, 7, 2, 3),
                             Masking::block_causal, FeatureMap::identity, true, true},
                        Case{"3d-unnormalized", 1, 1, 2, 3, TokenLayout::grid3d(3, 3, 3, 2, 2, 2),
                             Masking::none, FeatureMap::elu1, false},
                        Case{"1d-toeplitz", 1, 2, 3, 3, TokenLayout::sequence(17, 3),
                             Masking::block_causal, FeatureMap::relu, true, false, 2}}) {
    check_every_block<float>(c);
    check_every_block<double>(c);
  }
}

TEST(BadInput, DenseMixingIsBoundedAndSaysSo) {
  EXPECT_THAT(
      [] { init_mixing(TokenLayout::sequence(65536, 1)); },
      ThrowsMessage<Error>(AllOf(HasSubstr("limited to M <= 8192"), HasSubstr("Toeplitz mixing"))));
  const std::vector<float> t = {1.0f, 0.5f};
  EXPECT_THAT([&] { toeplitz_to_dense(view(t, {2}), 8193); },
              ThrowsMessage<Error>(HasSubstr("[1, 8192]")));
}

TEST(BadInput, ImpossibleAllocationsAreNamedWithTheirBytes) {
  // Beyond what std::vector can hold: refused before any memory is asked for.
  EXPECT_THAT([] { init_toeplitz_mixing(std::numeric_limits<int64_t>::max() - 1); },
              ThrowsMessage<OutOfMemory>(
                  AllOf(HasSubstr("init_toeplitz_mixing: cannot allocate 3.68935e+19 bytes"),
                        HasSubstr("Toeplitz mixing vector"))));
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reports a failed operator new itself instead of throwing";
#else
  // 2^30 heads of state (over 100 GiB): operator new fails and says how much was asked.
  DecoderOptions d;
  d.batch = 1 << 20, d.heads = 1 << 10, d.dk = 1, d.dv = 1, d.block = 4;
  const std::vector<float> w = {1.0f};
  EXPECT_THAT(
      [&] {
        Decoder decoder(d, view(w, {1, 1}));
      },
      ThrowsMessage<OutOfMemory>(AllOf(HasSubstr("mhla::Decoder: cannot allocate "),
                                       HasSubstr("e+11 bytes"),
                                       HasSubstr("decoding state of 1048576 x 1024 heads"))));
#endif
}

// DeviceChecks::deferred is a setting for device tensors: CPU calls still
// check before they return, and with no device call pending the explicit
// check has nothing to report.
TEST(BadInput, CpuCallsCheckAtOnceWhateverTheDeviceSetting) {
  const DeviceExecution before = device_execution();
  set_device_execution({nullptr, DeviceChecks::deferred});
  EXPECT_EQ(device_execution().checks, DeviceChecks::deferred);
  Tiny<float> t(4, 2, 2, 0.5f, 0.5f, 0.5f);
  t.w = {-1.0f};
  EXPECT_THAT([&] { t.forward(); },
              ThrowsMessage<Error>(HasSubstr("w[0, 0] = -1.000000 is negative")));
  check_device_results();
  set_device_execution(before);
  EXPECT_EQ(device_execution().checks, DeviceChecks::sync);
}

// The CUDA kernel families are options of the call: a forward state records
// them, so a backward that asks for other kernels than its forward ran is
// refused by name (the CPU ignores them otherwise).
TEST(BadInput, AForwardStateRecordsTheCallsCudaKernels) {
  Tiny<float> t(8, 2, 3, 0.5f, 0.25f, 1.0f);
  ForwardState<float> state;
  forward<float>(t.options, view(t.q, t.qs), view(t.k, t.qs), view(t.v, t.vs), view(t.w, {1, 1}),
                 view(t.o, t.vs), state);
  std::vector<float> g(t.o.size(), 1.0f), gq(t.q.size()), gk(t.k.size()), gv(t.v.size()), gw(1);
  Options other = t.options;
  other.cuda.bf16_state = true;
  EXPECT_THAT(
      [&] {
        backward<float>(other, view(t.q, t.qs), view(t.k, t.qs), view(t.v, t.vs), view(t.w, {1, 1}),
                        view(t.o, t.vs), view(g, t.vs), view(gq, t.qs), view(gk, t.qs),
                        view(gv, t.vs), view(gw, {1, 1}), state);
      },
      ThrowsMessage<Error>(HasSubstr("the options differ from those of the forward()")));
  backward<float>(t.options, view(t.q, t.qs), view(t.k, t.qs), view(t.v, t.vs), view(t.w, {1, 1}),
                  view(t.o, t.vs), view(g, t.vs), view(gq, t.qs), view(gk, t.qs), view(gv, t.vs),
                  view(gw, {1, 1}), state);
}

}  // namespace
}  // namespace mhla::test
