// Bad input must raise mhla::Error with a message naming the argument, what was
// expected and what was given; never a crash or silent garbage.
#include <cmath>
#include <limits>

#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::AllOf;
using testing::HasSubstr;
using testing::ThrowsMessage;

struct Call {
  Options options;
  std::vector<float> q, k, v, w, o;
  std::vector<int64_t> qs, ks, vs, ws, os;

  Call() {
    options.layout = TokenLayout::sequence(8, 4);
    qs = ks = {1, 8, 2, 4};
    vs = os = {1, 8, 2, 3};
    ws = {2, 2};
    q.assign(64, 0.5f);
    k.assign(64, 0.5f);
    v.assign(48, 0.5f);
    o.assign(48, 0.0f);
    w.assign(4, 0.5f);
  }
  void run() {
    forward<float>(options, {q.data(), qs}, {k.data(), ks}, {v.data(), vs}, {w.data(), ws},
                   {o.data(), os});
  }
};

std::string error_of(Call& call) {
  try {
    call.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Validation, OptionNamesParseBackAndUnknownNamesListTheChoices) {
  for (auto m : {Masking::none, Masking::causal, Masking::block_causal})
    EXPECT_EQ(parse_masking(to_string(m)), m);
  for (auto f : {FeatureMap::identity, FeatureMap::relu, FeatureMap::elu1})
    EXPECT_EQ(parse_feature_map(to_string(f)), f);
  for (auto f : {MixingForm::dense, MixingForm::toeplitz})
    EXPECT_EQ(parse_mixing_form(to_string(f)), f);
  EXPECT_THAT([] { parse_masking("Causal"); },
              ThrowsMessage<Error>(
                  HasSubstr("unknown masking 'Causal'; expected none, causal or block_causal")));
  EXPECT_THAT(
      [] { parse_feature_map(""); },
      ThrowsMessage<Error>(HasSubstr("unknown feature map ''; expected identity, relu or elu1")));
  EXPECT_THAT(
      [] { parse_mixing_form("sparse"); },
      ThrowsMessage<Error>(HasSubstr("unknown mixing form 'sparse'; expected dense or toeplitz")));
}

TEST(Validation, ValidCallSucceeds) {
  Call call;
  EXPECT_EQ(error_of(call), "no error");
}

TEST(Validation, MismatchedShapesNameTheArgument) {
  Call c1;
  c1.ks = {1, 8, 2, 5};
  EXPECT_THAT(error_of(c1),
              HasSubstr("mhla::forward: k has shape [1, 8, 2, 5], expected [1, 8, 2, 4]"));
  Call c2;
  c2.vs = {1, 7, 2, 3};
  EXPECT_THAT(error_of(c2), HasSubstr("v has shape [1, 7, 2, 3], expected [1, 8, 2, 3]"));
  Call c3;
  c3.os = {1, 8, 2, 4};
  EXPECT_THAT(error_of(c3), HasSubstr("o has shape [1, 8, 2, 4], expected [1, 8, 2, 3]"));
  Call c4;
  c4.qs = {8, 2, 4};
  EXPECT_THAT(error_of(c4), HasSubstr("q must have rank 4 [B, N, H, Dk], got shape [8, 2, 4]"));
}

// A call whose q is on the CPU runs there: memory of another device is
// refused by name before anything reads it, in every entry point (output
// views included), whether or not this build has a CUDA backend.
TEST(Validation, TensorsOnAnotherDeviceAreRefusedByName) {
  Call call;
  const auto on_cuda = [](auto* data, const std::vector<int64_t>& shape) {
    return TensorView<std::remove_pointer_t<decltype(data)>>{data, shape, Device::cuda};
  };
  const std::string expected = "mhla::forward: k is on the cuda device, but this ";
  EXPECT_THAT(
      [&] {
        forward<float>(call.options, {call.q.data(), call.qs}, on_cuda(call.k.data(), call.ks),
                       {call.v.data(), call.vs}, {call.w.data(), call.ws},
                       {call.o.data(), call.os});
      },
      ThrowsMessage<Error>(AllOf(HasSubstr(expected), HasSubstr("pass CPU memory"))));
  EXPECT_THAT(
      [&] {
        forward<float>(call.options, {call.q.data(), call.qs}, {call.k.data(), call.ks},
                       {call.v.data(), call.vs}, {call.w.data(), call.ws},
                       on_cuda(call.o.data(), call.os));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::forward: o is on the cuda device")));
  std::vector<float> summaries(2 * 2 * 4 * 4);
  EXPECT_THAT(
      [&] {
        block_summaries<float>(call.options, on_cuda(call.k.data(), call.ks),
                               {call.v.data(), call.vs}, {summaries.data(), {1, 2, 2, 4, 4}});
      },
      ThrowsMessage<Error>(HasSubstr("mhla::block_summaries: k is on the cuda device")));
  EXPECT_EQ(std::string(to_string(Device::cpu)), "cpu");
}

TEST(Validation, ZeroNegativeAndOverflowingSizes) {
  Call c1;
  c1.qs = c1.ks = {1, 8, 0, 4};
  EXPECT_THAT(error_of(c1), HasSubstr("every extent must be positive"));
  Call c2;
  c2.qs = c2.ks = {1, 8, -2, 4};
  EXPECT_THAT(error_of(c2), HasSubstr("q has shape [1, 8, -2, 4]"));
  Call c3;
  c3.qs = c3.ks = {1 << 20, 1 << 20, 1 << 20, 4};
  EXPECT_THAT(error_of(c3), HasSubstr("mhla::forward: q has shape [1048576, 1048576, 1048576, 4] "
                                      "whose element count overflows 64-bit byte counts"));
}

TEST(Validation, LayoutMustMatchTokens) {
  Call c1;
  c1.options.layout = TokenLayout::grid2d(3, 3, 2, 2);
  EXPECT_THAT(error_of(c1), HasSubstr("has 9 tokens but q has N = 8"));
  Call c2;
  c2.options.layout = TokenLayout();
  EXPECT_THAT(error_of(c2), HasSubstr("options.layout is not set"));
}

TEST(Validation, MixingMatrixMustMatchBlockGrid) {
  Call c1;
  c1.ws = {3, 3};
  c1.w.assign(9, 0.5f);
  EXPECT_THAT(error_of(c1), HasSubstr("w has shape [3, 3], expected [2, 2] (M = 2 blocks of 1D"));
  Call c2;
  c2.ws = {3, 2, 2};
  c2.w.assign(12, 0.5f);
  EXPECT_THAT(error_of(c2), HasSubstr("w has shape [3, 2, 2], expected [2, 2, 2]"));
  Call c3;
  c3.ws = {4};
  EXPECT_THAT(error_of(c3), HasSubstr("w must have shape [M, M] or [H, M, M] with M = 2"));
}

TEST(Validation, CausalNeedsA1DLayout) {
  Call call;
  call.options.layout = TokenLayout::grid2d(2, 4, 2, 2);
  call.options.masking = Masking::causal;
  EXPECT_THAT(error_of(call), HasSubstr("causal masking needs a 1D layout, got 2D: 2x4 grid"));
}

TEST(Validation, BlockCausalWorksOnAnyLayoutButNotForLinearAttention) {
  Call call;
  call.options.layout = TokenLayout::grid2d(2, 4, 2, 2);
  call.options.masking = Masking::block_causal;
  call.w[1] = -0.25f;  // upper triangle: unused
  call.options.normalize = true;
  EXPECT_EQ(error_of(call), "no error");
  std::vector<float> q(64), o(48);
  LinearAttentionOptions lin;
  lin.masking = Masking::block_causal;
  try {
    linear_attention_forward<float>(lin, {q.data(), {1, 8, 2, 4}}, {q.data(), {1, 8, 2, 4}},
                                    {q.data(), {1, 8, 2, 3}}, {o.data(), {1, 8, 2, 3}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("block_causal masking needs MHLA's block layout"));
  }
}

TEST(Validation, NegativeOrNonFiniteMixingWeights) {
  Call c1;
  c1.w[1] = -0.25f;
  EXPECT_THAT(error_of(c1), HasSubstr("w[0, 1] = -0.250000 is negative"));
  Call c2;
  c2.w[1] = -0.25f;
  c2.options.normalize = false;  // allowed without normalisation
  EXPECT_EQ(error_of(c2), "no error");
  Call c3;
  c3.w[1] = -0.25f;
  c3.options.masking = Masking::causal;  // upper triangle unused in causal mode
  EXPECT_EQ(error_of(c3), "no error");
  Call c4;
  c4.w[2] = std::nanf("");
  EXPECT_THAT(error_of(c4), HasSubstr("w[1, 0] is not finite"));
  // The edges of the one-pass check on the weights' bit patterns: -0 is not
  // below zero; -NaN and the infinities are not finite, with or without
  // normalisation; the smallest negative subnormal is negative.
  Call zero;
  zero.w[1] = -0.0f;
  EXPECT_EQ(error_of(zero), "no error");
  for (const bool normalize : {true, false})
    for (const float bad : {-std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      Call c;
      c.w[3] = bad;
      c.options.normalize = normalize;
      EXPECT_THAT(error_of(c), HasSubstr("w[1, 1] is not finite")) << bad << " " << normalize;
    }
  Call tiny;
  tiny.w[1] = -std::numeric_limits<float>::denorm_min();
  EXPECT_THAT(error_of(tiny), HasSubstr("w[0, 1] = -0.000000 is negative"));
}

TEST(Validation, ToeplitzMixingShapesAndMasking) {
  Call ok;
  ok.options.mixing = MixingForm::toeplitz;
  ok.options.masking = Masking::causal;
  ok.ws = {4};  // L = 3: any number of blocks
  EXPECT_EQ(error_of(ok), "no error");
  Call per_head = ok;
  per_head.ws = {2, 2};  // [H, L + 1]
  EXPECT_EQ(error_of(per_head), "no error");
  Call unmasked = ok;
  unmasked.options.masking = Masking::none;
  EXPECT_THAT(error_of(unmasked), HasSubstr("Toeplitz mixing W[i, b] = w[min(i - b, L)] needs "
                                            "causal or block_causal masking"));
  Call wrong_heads = ok;
  wrong_heads.ws = {3, 1};
  EXPECT_THAT(error_of(wrong_heads), HasSubstr("w has shape [3, 1], expected [2, 1]"));
  Call rank3 = ok;
  rank3.ws = {1, 2, 2};
  EXPECT_THAT(error_of(rank3), HasSubstr("Toeplitz w must have shape [L + 1] or [H, L + 1]"));
  Call negative = ok;
  negative.w[3] = -1.0f;
  EXPECT_THAT(error_of(negative), HasSubstr("w[3] = -1.000000 is negative"));
  Call negative_head = per_head;
  negative_head.w[3] = -1.0f;
  EXPECT_THAT(error_of(negative_head), HasSubstr("w[1, 1] = -1.000000 is negative"));
}

TEST(Validation, NullPointersAndOptions) {
  Call c1;
  c1.q.clear();
  c1.q.shrink_to_fit();
  EXPECT_THAT(error_of(c1), HasSubstr("q is a null pointer"));
  Call c2;
  c2.options.eps = -1;
  EXPECT_THAT(error_of(c2), HasSubstr("options.eps must be finite and >= 0"));
  Call c3;
  c3.options.scale = 0.5;
  EXPECT_THAT(error_of(c3), HasSubstr("options.scale applies to the unnormalized mode only"));
}

TEST(Validation, BackwardChecksGradientShapes) {
  Call c;
  std::vector<float> g(48), gq(64), gk(64), gv(48), gw(9);
  try {
    backward<float>(c.options, {c.q.data(), c.qs}, {c.k.data(), c.ks}, {c.v.data(), c.vs},
                    {c.w.data(), c.ws}, {c.o.data(), c.os}, {g.data(), c.os}, {gq.data(), c.qs},
                    {gk.data(), c.ks}, {gv.data(), c.vs}, {gw.data(), {3, 3}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("grad_w has shape [3, 3], expected [2, 2]"));
  }
}

TEST(Validation, BaselinesValidateToo) {
  std::vector<float> q(64), o(48), lse(2 * 8);
  EXPECT_THROW(
      linear_attention_forward<float>({}, {q.data(), {1, 8, 2, 4}}, {q.data(), {1, 8, 2, 4}},
                                      {q.data(), {1, 9, 2, 3}}, {o.data(), {1, 8, 2, 3}}),
      Error);
  try {
    softmax_attention_forward<float>({}, {q.data(), {1, 8, 2, 4}}, {q.data(), {1, 8, 2, 4}},
                                     {q.data(), {1, 8, 2, 3}}, {o.data(), {1, 8, 2, 3}},
                                     {lse.data(), {1, 8, 2}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("lse has shape [1, 8, 2], expected [1, 2, 8]"));
  }
}

}  // namespace
}  // namespace mhla::test
