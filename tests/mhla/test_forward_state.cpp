// forward() and backward() with a ForwardState: the results of a state over
// the caller's arrays, bit for bit, and a state that does not belong to the
// call refused by name.
#include <cstring>

#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;
using testing::ThrowsMessage;

// One call's tensors in T (w in W), with the results of both ways of saving.
template <typename T, typename W = T>
struct Call {
  Case c;
  std::vector<T> q, k, v, g;
  std::vector<W> w;
  std::vector<T> o, gq, gk, gv;
  std::vector<W> gw;

  Call(const Case& c_, const Inputs& in, std::vector<T> (*convert)(const std::vector<double>&))
      : c(c_),
        q(convert(in.q)),
        k(convert(in.k)),
        v(convert(in.v)),
        g(convert(in.grad_o)),
        w(in.w.begin(), in.w.end()),
        o(v.size()),
        gq(q.size()),
        gk(k.size()),
        gv(v.size()),
        gw(w.size()) {}

  void forward(ForwardState<W>& state) {
    mhla::forward(c.options(), view(std::as_const(q), c.q_shape()),
                  view(std::as_const(k), c.q_shape()), view(std::as_const(v), c.v_shape()),
                  view(std::as_const(w), c.w_shape()), view(o, c.v_shape()), state);
  }
  void backward(const ForwardState<W>& state) {
    mhla::backward(c.options(), view(std::as_const(q), c.q_shape()),
                   view(std::as_const(k), c.q_shape()), view(std::as_const(v), c.v_shape()),
                   view(std::as_const(w), c.w_shape()), view(std::as_const(o), c.v_shape()),
                   view(std::as_const(g), c.v_shape()), view(gq, c.q_shape()),
                   view(gk, c.q_shape()), view(gv, c.v_shape()), view(gw, c.w_shape()), state);
  }
  // forward and backward with a state over arrays the caller owns, made anew
  // for backward (as the Python bindings keep them in torch tensors).
  void with_state_over_arrays() {
    const auto ss = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
    std::vector<W> saved(size_t(numel(ss))), mixed(saved.size());
    auto filled = ForwardState<W>::over(view(saved, ss), view(mixed, ss));
    forward(filled);
    backward(ForwardState<W>::over(view(saved, ss), view(mixed, ss)));
  }
  std::vector<std::vector<char>> results() const {
    auto bytes = [](const auto& x) {
      const char* p = reinterpret_cast<const char*>(x.data());
      return std::vector<char>(p, p + x.size() * sizeof(x[0]));
    };
    return {bytes(o), bytes(gq), bytes(gk), bytes(gv), bytes(gw)};
  }
};

template <typename T>
std::vector<T> converted(const std::vector<double>& x) {
  return cast<T>(x);
}

const Case kCases[] = {
    Case{"1d", 2, 3, 8, 5, TokenLayout::sequence(45, 8)},
    Case{"1d-causal", 1, 2, 6, 7, TokenLayout::sequence(45, 8), Masking::causal},
    Case{"1d-block-causal-toeplitz", 2, 2, 4, 3, TokenLayout::sequence(29, 4),
         Masking::block_causal, FeatureMap::elu1, true, true, 2},
    Case{"2d-per-head", 1, 2, 5, 4, TokenLayout::grid2d(7, 6, 3, 4), Masking::none,
         FeatureMap::relu, true, true},
};

template <typename T, typename W>
void expect_same_results(std::vector<T> (*convert)(const std::vector<double>&)) {
  ForwardState<W> state;  // one state through every case: its arrays are reused or replaced
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 17);
    Call<T, W> saved(c, in, convert), kept(c, in, convert);
    saved.with_state_over_arrays();
    kept.forward(state);
    EXPECT_FALSE(state.empty());
    kept.backward(state);
    EXPECT_EQ(kept.results(), saved.results());
    kept.backward(state);  // a second backward reads the same state
    EXPECT_EQ(kept.results(), saved.results());
  }
}

TEST(ForwardState, GivesTheResultsOfAStateOverTheCallersArraysBitForBit) {
  expect_same_results<float, float>(converted<float>);
  expect_same_results<double, double>(converted<double>);
  expect_same_results<bfloat16, float>(rounded_to_bfloat16);
}

TEST(ForwardState, AnEmptyStateIsRefused) {
  const Inputs in = make_inputs(kCases[0], 3);
  Call<float> call(kCases[0], in, converted<float>);
  ForwardState<float> state;
  EXPECT_TRUE(state.empty());
  EXPECT_THAT([&] { call.backward(state); },
              ThrowsMessage<Error>(HasSubstr("mhla::backward: state is empty")));
  // A forward that fails leaves the state empty, and names its own problem.
  call.forward(state);
  auto bad = call;
  bad.w[0] = -1.0f;
  EXPECT_THAT([&] { bad.forward(state); }, ThrowsMessage<Error>(HasSubstr("is negative")));
  EXPECT_TRUE(state.empty());
  EXPECT_THAT([&] { call.backward(state); }, ThrowsMessage<Error>(HasSubstr("state is empty")));
}

TEST(ForwardState, AStateOfAnotherCallIsRefusedByName) {
  const Inputs in = make_inputs(kCases[0], 5);
  Call<float> call(kCases[0], in, converted<float>);
  ForwardState<float> state;
  call.forward(state);
  // The same values at another address: not the tensor forward read.
  Call<float> copy = call;
  EXPECT_THAT([&] { copy.backward(state); },
              ThrowsMessage<Error>(HasSubstr("q is not the tensor that the forward()")));
  // Other options.
  Call<float> causal = call;
  causal.c.masking = Masking::block_causal;
  causal.q = std::move(call.q), causal.k = std::move(call.k), causal.v = std::move(call.v);
  causal.w = std::move(call.w), causal.o = std::move(call.o);
  EXPECT_THAT([&] { causal.backward(state); },
              ThrowsMessage<Error>(HasSubstr("the options differ")));
  // w written in place between the passes (an optimizer step).
  causal.c.masking = Masking::none;
  causal.backward(state);
  causal.w[1] += 0.25f;
  EXPECT_THAT([&] { causal.backward(state); },
              ThrowsMessage<Error>(HasSubstr("w changed since the forward()")));
}

TEST(ForwardState, MovesKeepTheRecord) {
  const Inputs in = make_inputs(kCases[1], 7);
  Call<double> call(kCases[1], in, converted<double>), want(kCases[1], in, converted<double>);
  want.with_state_over_arrays();
  ForwardState<double> state;
  call.forward(state);
  ForwardState<double> moved = std::move(state);
  call.backward(moved);
  EXPECT_EQ(call.results(), want.results());
}

}  // namespace
}  // namespace mhla::test
