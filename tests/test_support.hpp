#pragma once
// Shared helpers for the tests: random inputs, a catalogue of awkward cases,
// and tolerance checks that scale with the magnitude of the reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "mhla/mhla.hpp"

namespace mhla::test {

// One operator configuration with its shapes.
struct Case {
  std::string name;
  int64_t batch, heads, dk, dv;
  TokenLayout layout;
  Masking masking = Masking::none;
  FeatureMap phi = FeatureMap::elu1;
  bool normalize = true;
  bool per_head = false;
  int64_t toeplitz_length = -1;  // >= 0: Toeplitz mixing with this L; -1: dense w
  CudaKernels cuda{};            // the CUDA kernel families the call asks for

  int64_t tokens() const { return layout.num_tokens(); }
  int64_t blocks() const { return layout.num_blocks(); }
  Options options() const {
    Options o;
    o.layout = layout;
    o.masking = masking;
    o.feature_map = phi;
    o.normalize = normalize;
    o.mixing = toeplitz_length >= 0 ? MixingForm::toeplitz : MixingForm::dense;
    o.cuda = cuda;
    return o;
  }
  std::vector<int64_t> q_shape() const { return {batch, tokens(), heads, dk}; }
  std::vector<int64_t> v_shape() const { return {batch, tokens(), heads, dv}; }
  std::vector<int64_t> w_shape() const {
    if (toeplitz_length >= 0)
      return per_head ? std::vector<int64_t>{heads, toeplitz_length + 1}
                      : std::vector<int64_t>{toeplitz_length + 1};
    return per_head ? std::vector<int64_t>{heads, blocks(), blocks()}
                    : std::vector<int64_t>{blocks(), blocks()};
  }
  std::string label() const {
    return name + "/" + to_string(masking) + "/" + to_string(phi) +
           (normalize ? "/normalized" : "/unnormalized") + (per_head ? "/per-head" : "/shared") +
           (toeplitz_length >= 0 ? "/toeplitz" + std::to_string(toeplitz_length) : "");
  }
};

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

inline std::vector<double> uniform(int64_t n, double lo, double hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

// Inputs of a case, in double. Identity features with normalisation need
// positive q and k (otherwise denominators cross zero); the mixing matrix is
// non-negative in normalized mode and signed otherwise.
struct Inputs {
  std::vector<double> q, k, v, w, grad_o;
};

inline Inputs make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool positive = c.phi == FeatureMap::identity && c.normalize;
  Inputs in;
  in.q = uniform(numel(c.q_shape()), positive ? 0.05 : -1.0, 1.0, rng);
  in.k = uniform(numel(c.q_shape()), positive ? 0.05 : -1.0, 1.0, rng);
  in.v = uniform(numel(c.v_shape()), -1.0, 1.0, rng);
  in.w = uniform(numel(c.w_shape()), c.normalize ? 0.05 : -1.0, 1.0, rng);
  in.grad_o = uniform(numel(c.v_shape()), -1.0, 1.0, rng);
  return in;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <typename T>
TensorView<const T> view(const std::vector<T>& x, std::vector<int64_t> shape) {
  return {x.data(), std::move(shape)};
}
template <typename T>
TensorView<T> view(std::vector<T>& x, std::vector<int64_t> shape) {
  return {x.data(), std::move(shape)};
}

// The operator's forward output and every gradient of one case.
template <typename T>
struct OperatorResults {
  std::vector<T> o, gq, gk, gv, gw;
  // Bit for bit (memcmp: -0 differs from 0, and a NaN equals itself).
  bool operator==(const OperatorResults& r) const {
    auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
    };
    return same(o, r.o) && same(gq, r.gq) && same(gk, r.gk) && same(gv, r.gv) && same(gw, r.gw);
  }
};

// forward then backward (grad_o from the inputs) in T on `threads` OpenMP threads.
template <typename T>
OperatorResults<T> run_operator(const Case& c, const Inputs& in, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), w = cast<T>(in.w),
             g = cast<T>(in.grad_o);
  OperatorResults<T> r{std::vector<T>(v.size()), std::vector<T>(q.size()), std::vector<T>(k.size()),
                       std::vector<T>(v.size()), std::vector<T>(w.size())};
  forward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
             view(w, c.w_shape()), view(r.o, c.v_shape()));
  backward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
              view(w, c.w_shape()), view(r.o, c.v_shape()), view(g, c.v_shape()),
              view(r.gq, c.q_shape()), view(r.gk, c.q_shape()), view(r.gv, c.v_shape()),
              view(r.gw, c.w_shape()));
  omp_set_num_threads(saved);
  return r;
}

// Max |got - want| relative to max(largest |want|, 1): a tolerance means "this
// many units of the tensor's scale", and gradients that are small only through
// cancellation of O(1) terms are judged against the scale of those terms (the
// inputs of every test are O(1)).
template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<double>& want,
                      double floor = 1.0) {
  double scale = floor, err = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    if (!(d <= err)) err = d;  // also catches NaN
  }
  return err / scale;
}

// x rounded to bfloat16 (to nearest, ties to even), and bfloat16 values back
// as doubles (exact).
inline std::vector<bfloat16> rounded_to_bfloat16(const std::vector<double>& x) {
  std::vector<bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_bfloat16(float(x[i]));
  return out;
}

inline std::vector<double> bfloat16_values(const std::vector<bfloat16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

// The same for float16.
inline std::vector<float16> rounded_to_float16(const std::vector<double>& x) {
  std::vector<float16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float16(float(x[i]));
  return out;
}

inline std::vector<double> float16_values(const std::vector<float16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

// x rounded to the 16-bit type H, and H's values back as doubles: for tests
// run on both bfloat16 and float16.
template <typename H>
std::vector<H> rounded_to(const std::vector<double>& x) {
  if constexpr (std::is_same_v<H, bfloat16>)
    return rounded_to_bfloat16(x);
  else
    return rounded_to_float16(x);
}
inline std::vector<double> values_of(const std::vector<bfloat16>& x) { return bfloat16_values(x); }
inline std::vector<double> values_of(const std::vector<float16>& x) { return float16_values(x); }

// The 16-bit operator's results (H: bfloat16 or float16), bit for bit.
template <typename H>
struct HalfResults {
  std::vector<H> o, gq, gk, gv;
  std::vector<float> gw;
  bool operator==(const HalfResults& r) const {
    auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(o, r.o) && same(gq, r.gq) && same(gk, r.gk) && same(gv, r.gv) && same(gw, r.gw);
  }
};

// The 16-bit forward (keeping the summaries and mixed summaries when `save`)
// then backward, on the inputs rounded by `round` and a float32 w.
template <typename H, typename Round>
HalfResults<H> run_half(const Case& c, const Inputs& in, Round round, bool save) {
  const std::vector<H> q = round(in.q), k = round(in.k), v = round(in.v), g = round(in.grad_o);
  const std::vector<float> w(in.w.begin(), in.w.end());
  HalfResults<H> r{std::vector<H>(v.size()), std::vector<H>(q.size()), std::vector<H>(k.size()),
                   std::vector<H>(v.size()), std::vector<float>(w.size())};
  const TensorView<const H> qv{q.data(), c.q_shape()}, kv{k.data(), c.q_shape()},
      vv{v.data(), c.v_shape()}, gv{g.data(), c.v_shape()};
  const TensorView<const float> wv{w.data(), c.w_shape()};
  const TensorView<H> ov{r.o.data(), c.v_shape()}, gqv{r.gq.data(), c.q_shape()},
      gkv{r.gk.data(), c.q_shape()}, gvv{r.gv.data(), c.v_shape()};
  const TensorView<float> gwv{r.gw.data(), c.w_shape()};
  ForwardState<float> state;
  if (save) {
    forward<H>(c.options(), qv, kv, vv, wv, ov, state);
    backward<H>(c.options(), qv, kv, vv, wv, ov, gv, gqv, gkv, gvv, gwv, state);
  } else {
    forward<H>(c.options(), qv, kv, vv, wv, ov);
    backward<H>(c.options(), qv, kv, vv, wv, ov, gv, gqv, gkv, gvv, gwv);
  }
  return r;
}

// Each argument is evaluated once (got may be a call with side effects).
#define EXPECT_CLOSE(got, want, tol, what)                                     \
  do {                                                                         \
    const auto& mhla_got = (got);                                              \
    const auto& mhla_want = (want);                                            \
    ASSERT_EQ(mhla_got.size(), mhla_want.size()) << what;                      \
    const double mhla_err = ::mhla::test::relative_error(mhla_got, mhla_want); \
    EXPECT_LE(mhla_err, (tol)) << what << ": relative error " << mhla_err;     \
  } while (0)

// The catalogue of awkward shapes the fast paths must match the references on.
inline std::vector<Case> shape_cases() {
  std::vector<Case> cases = {
      {"1d-ragged", 2, 3, 5, 7, TokenLayout::sequence(37, 8)},
      {"1d-one-token", 1, 1, 4, 3, TokenLayout::sequence(1, 1)},
      {"1d-single-block", 1, 2, 6, 6, TokenLayout::sequence(20, 32)},
      {"1d-blocks-equal-tokens", 1, 2, 4, 5, TokenLayout::sequence(9, 1)},
      // More blocks than one strip of the masked mix (24 rows of W): 61 = 24 + 24 + 13.
      {"1d-many-blocks", 1, 2, 3, 4, TokenLayout::sequence(122, 2)},
      {"1d-dk1-dv3", 2, 1, 1, 3, TokenLayout::sequence(17, 4)},
      {"1d-dk59-dv3", 1, 2, 59, 3, TokenLayout::sequence(23, 6)},
      {"1d-dk3-dv59", 1, 1, 3, 59, TokenLayout::sequence(19, 5)},
      {"2d-ragged", 2, 2, 6, 5, TokenLayout::grid2d(7, 5, 3, 2)},
      {"2d-non-square", 1, 3, 4, 4, TokenLayout::grid2d(4, 9, 2, 4)},
      {"3d-ragged", 1, 2, 5, 6, TokenLayout::grid3d(3, 5, 4, 2, 2, 3)},
  };
  return cases;
}

// Each shape crossed with every mode its layout allows: masking, feature map,
// normalisation, shared or per-head mixing, and for the masked modes dense or
// Toeplitz mixing. The Toeplitz length L cycles through 0 (tail only), 1, 2, 3
// and 8 (usually longer than M) across feature maps and normalisations, so
// each shape meets several without a full cross product.
inline std::vector<Case> with_all_modes(const std::vector<Case>& shapes) {
  constexpr int64_t kToeplitzLengths[] = {2, 0, 1, 3, 8, 2};
  std::vector<Case> out;
  for (const Case& base : shapes)
    for (Masking masking : {Masking::none, Masking::causal, Masking::block_causal}) {
      if (masking == Masking::causal && base.layout.rank() != 1) continue;
      int64_t variant = 0;
      for (FeatureMap phi : {FeatureMap::identity, FeatureMap::relu, FeatureMap::elu1})
        for (bool normalize : {true, false}) {
          const int64_t length = kToeplitzLengths[variant++];
          for (bool per_head : {false, true})
            for (bool toeplitz : {false, true}) {
              if (toeplitz && masking == Masking::none) continue;
              Case c = base;
              c.masking = masking;
              c.phi = phi;
              c.normalize = normalize;
              c.per_head = per_head;
              c.toeplitz_length = toeplitz ? length : -1;
              out.push_back(c);
            }
        }
    }
  return out;
}

inline std::vector<Case> all_mode_cases() { return with_all_modes(shape_cases()); }

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.label() << " [B=" << c.batch << " H=" << c.heads << " Dk=" << c.dk << " Dv=" << c.dv
      << " " << c.layout.describe() << "]";
}

inline std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string s = info.param.label();
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace mhla::test
