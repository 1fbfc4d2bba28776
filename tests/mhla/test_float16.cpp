// The float16 operator (float16 q, k, v, o and gradients; float32 w, grad_w
// and saved arrays): on the CPU it is the float32 operator on the widened
// inputs with each result rounded once, bit for bit, on the catalogue of
// modes and awkward shapes; a result beyond float16's range is a named error;
// a ForwardState round-trips. The conversions of mhla/float16.hpp first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::AllOf;
using testing::HasSubstr;
using testing::ThrowsMessage;

TEST(Float16, EveryValueWidensExactlyAndNarrowsBackToItself) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float16 h{uint16_t(bits)};
    const float x = to_float(h);
    const bool nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0;
    ASSERT_EQ(std::isnan(x), nan) << std::hex << bits;
    if (nan) {
      ASSERT_TRUE(std::isnan(to_float(to_float16(x)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(to_float16(x).bits, bits) << std::hex << bits;
  }
  EXPECT_EQ(to_float(float16{0x3c00}), 1.0f);
  EXPECT_EQ(to_float(float16{0x7bff}), kFloat16Max);
  EXPECT_EQ(to_float(float16{0x0001}), std::ldexp(1.0f, -24));  // the smallest subnormal
}

TEST(Float16, NarrowingRoundsToNearestWithTiesToEven) {
  const auto bits_of = [](float f) { return to_float16(f).bits; };
  // Halfway between 1 and 1 + 2^-10 goes to 1 (even); between 1 + 2^-10
  // and 1 + 2^-9 up to the even one.
  EXPECT_EQ(bits_of(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(bits_of(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(bits_of(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // The top of the range: below 65520 to 65504, from it on to infinity.
  EXPECT_EQ(bits_of(65519.0f), 0x7bff);
  EXPECT_EQ(bits_of(65520.0f), 0x7c00);
  EXPECT_EQ(bits_of(-1e9f), 0xfc00);
  // Subnormals, in units of 2^-24: half a unit ties to 0, 1.5 units to 2.
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(bits_of(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(bits_of(-std::ldexp(1.0f, -24)), 0x8001);
  // A carry out of the subnormals gives the smallest normal.
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
}

std::vector<float> widened(const std::vector<float16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}
std::vector<float16> rounded(const std::vector<float>& x) {
  std::vector<float16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float16(x[i]);
  return out;
}
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

HalfResults<float16> run_float16(const Case& c, const Inputs& in, bool save) {
  return run_half<float16>(c, in, rounded_to_float16, save);
}

// The float32 operator on the float16 inputs, widened.
OperatorResults<float> run_widened(const Case& c, const Inputs& in) {
  const auto q = widened(rounded_to_float16(in.q)), k = widened(rounded_to_float16(in.k)),
             v = widened(rounded_to_float16(in.v)), g = widened(rounded_to_float16(in.grad_o));
  const auto w = cast<float>(in.w);
  OperatorResults<float> r{std::vector<float>(v.size()), std::vector<float>(q.size()),
                           std::vector<float>(k.size()), std::vector<float>(v.size()),
                           std::vector<float>(w.size())};
  forward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(r.o, c.v_shape()));
  backward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                  view(w, c.w_shape()), view(std::as_const(r.o), c.v_shape()), view(g, c.v_shape()),
                  view(r.gq, c.q_shape()), view(r.gk, c.q_shape()), view(r.gv, c.v_shape()),
                  view(r.gw, c.w_shape()));
  return r;
}

TEST(Float16, IsTheFloatOperatorOnWidenedInputsRoundedOnce) {
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 5);
    const OperatorResults<float> want = run_widened(c, in);
    for (bool save : {true, false}) {
      SCOPED_TRACE(save ? "summaries saved" : "summaries recomputed");
      const HalfResults<float16> got = run_float16(c, in, save);
      EXPECT_TRUE(same_bits(got.o, rounded(want.o))) << "o";
      EXPECT_TRUE(same_bits(got.gq, rounded(want.gq))) << "grad_q";
      EXPECT_TRUE(same_bits(got.gk, rounded(want.gk))) << "grad_k";
      EXPECT_TRUE(same_bits(got.gv, rounded(want.gv))) << "grad_v";
      EXPECT_TRUE(same_bits(got.gw, want.gw)) << "grad_w";
    }
  }
}

// Unnormalised with a large scale, o leaves float16's range while float32
// holds it; so do the gradients with a large grad_o.
Case unnormalized_case() {
  Case c{"range", 1, 2, 8, 8, TokenLayout::sequence(48, 4)};
  c.normalize = false;
  return c;
}

TEST(Float16, AnOutputBeyondItsRangeIsANamedError) {
  Case c = unnormalized_case();
  Options options = c.options();
  options.scale = 1e5;
  const Inputs in = make_inputs(c, 6);
  const auto q = rounded_to_float16(in.q), k = rounded_to_float16(in.k),
             v = rounded_to_float16(in.v);
  const auto w = cast<float>(in.w);
  std::vector<float16> o(v.size());
  EXPECT_THAT(
      [&] {
        forward(options, view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                view(w, c.w_shape()), view(o, c.v_shape()));
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("mhla::forward: o["),
                                 HasSubstr("beyond float16's range (largest finite 65504)"),
                                 HasSubstr("pass bfloat16 or float32 tensors"))));
}

TEST(Float16, AGradientBeyondItsRangeIsANamedError) {
  const Case c = unnormalized_case();
  Inputs in = make_inputs(c, 7);
  for (double& g : in.grad_o) g *= 6e4;  // near float16's largest, still finite there
  const auto q = rounded_to_float16(in.q), k = rounded_to_float16(in.k),
             v = rounded_to_float16(in.v), g = rounded_to_float16(in.grad_o);
  const auto w = cast<float>(in.w);
  std::vector<float16> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size());
  std::vector<float> gw(w.size());
  forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
          view(w, c.w_shape()), view(o, c.v_shape()));
  EXPECT_THAT(
      [&] {
        backward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(std::as_const(o), c.v_shape()), view(g, c.v_shape()),
                 view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                 view(gw, c.w_shape()));
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("mhla::backward: grad_"),
                                 HasSubstr("beyond float16's range"),
                                 HasSubstr("a smaller loss scale"))));
}

TEST(Float16, AForwardStateGivesTheRecomputedGradients) {
  const Case c{"state", 2, 2, 8, 6, TokenLayout::sequence(40, 5), Masking::block_causal};
  const Inputs in = make_inputs(c, 8);
  const HalfResults<float16> saved = run_float16(c, in, false);
  const auto q = rounded_to_float16(in.q), k = rounded_to_float16(in.k),
             v = rounded_to_float16(in.v), g = rounded_to_float16(in.grad_o);
  const auto w = cast<float>(in.w);
  std::vector<float16> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size());
  std::vector<float> gw(w.size());
  ForwardState<float> state;
  forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
          view(w, c.w_shape()), view(o, c.v_shape()), state);
  backward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
           view(w, c.w_shape()), view(std::as_const(o), c.v_shape()), view(g, c.v_shape()),
           view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
           view(gw, c.w_shape()), state);
  EXPECT_TRUE(same_bits(o, saved.o));
  EXPECT_TRUE(same_bits(gq, saved.gq));
  EXPECT_TRUE(same_bits(gk, saved.gk));
  EXPECT_TRUE(same_bits(gv, saved.gv));
  EXPECT_TRUE(same_bits(gw, saved.gw));

  // The same memory read as bfloat16 is another call: refused by name.
  const auto as_bf16 = [&](const std::vector<float16>& x, const std::vector<int64_t>& shape) {
    return TensorView<const bfloat16>{reinterpret_cast<const bfloat16*>(x.data()), shape};
  };
  const auto as_bf16_out = [&](std::vector<float16>& x, const std::vector<int64_t>& shape) {
    return TensorView<bfloat16>{reinterpret_cast<bfloat16*>(x.data()), shape};
  };
  EXPECT_THAT(
      [&] {
        backward(c.options(), as_bf16(q, c.q_shape()), as_bf16(k, c.q_shape()),
                 as_bf16(v, c.v_shape()), view(w, c.w_shape()), as_bf16(o, c.v_shape()),
                 as_bf16(g, c.v_shape()), as_bf16_out(gq, c.q_shape()),
                 as_bf16_out(gk, c.q_shape()), as_bf16_out(gv, c.v_shape()), view(gw, c.w_shape()),
                 state);
      },
      ThrowsMessage<Error>(HasSubstr(
          "state was filled by a forward of float16 tensors, and this backward's q is bfloat16")));
}

}  // namespace
}  // namespace mhla::test
