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
