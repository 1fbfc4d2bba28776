// Results as large as the last-level cache are written with streaming stores
// when they start on a cache line (cpu/row_writer.hpp). The same call with
// every output one element off a line writes through the cache: both must
// give the same bits, forward and backward, float and bfloat16, with and
// without the causal mask (whose backward parks and then adds to grad_k and
// grad_v through the cache).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "mhla/line_aligned.hpp"
#include "mhla/mhla.hpp"

namespace mhla::test {
namespace {

// An output buffer, its data on a cache line or one element past one.
template <typename T>
struct Output {
  Output(size_t n, bool aligned) : storage(n + 1), data(storage.data() + (aligned ? 0 : 1)), n(n) {}
  TensorView<T> view(const std::vector<int64_t>& shape) { return {data, shape}; }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b(n * sizeof(T));
    std::memcpy(b.data(), data, b.size());
    return b;
  }
  detail::LineAlignedVector<T> storage;
  T* data;
  size_t n;
};

// One head of 64 values, random inputs: `tokens` rows of 64 * sizeof(T)
// bytes make 32 MiB.
template <typename T>
struct Problem {
  Problem(int64_t tokens, Masking masking) : shape{1, tokens, 1, 64} {
    options.layout = TokenLayout::sequence(tokens, 512);
    options.masking = masking;
    w = init_mixing(options.layout);
    w_shape = {options.layout.num_blocks(), options.layout.num_blocks()};
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* t : {&q, &k, &v, &g})
      for (int64_t i = 0; i < tokens * 64; ++i) {
        if constexpr (std::is_same_v<T, bfloat16>)
          t->push_back(to_bfloat16(normal(rng)));
        else
          t->push_back(normal(rng));
      }
  }
  Options options;
  std::vector<int64_t> shape, w_shape;
  std::vector<float> w;
  std::vector<T> q, k, v, g;
};

// Forward (keeping both arrays, in the caller's memory) and backward into
// outputs on lines or off them.
template <typename T>
std::vector<std::vector<unsigned char>> run(const Problem<T>& p, bool aligned) {
  const auto saved = saved_summaries_shape(p.options, p.shape, p.shape);
  size_t saved_n = 1;
  for (int64_t e : saved) saved_n *= size_t(e);
  const size_t n = p.q.size();
  Output<T> o(n, aligned), gq(n, aligned), gk(n, aligned), gv(n, aligned);
  Output<float> s(saved_n, aligned), x(saved_n, aligned), gw(p.w.size(), aligned);
  const TensorView<const float> w(p.w.data(), p.w_shape);
  const auto in = [&](const std::vector<T>& t) { return TensorView<const T>(t.data(), p.shape); };
  auto state = ForwardState<float>::over(s.view(saved), x.view(saved));
  forward<T>(p.options, in(p.q), in(p.k), in(p.v), w, o.view(p.shape), state);
  backward<T>(p.options, in(p.q), in(p.k), in(p.v), w, TensorView<const T>(o.data, p.shape),
              in(p.g), gq.view(p.shape), gk.view(p.shape), gv.view(p.shape), gw.view(p.w_shape),
              state);
  return {o.bytes(), gq.bytes(), gk.bytes(), gv.bytes(), gw.bytes(), s.bytes(), x.bytes()};
}

template <typename T>
void expect_streamed_equals_cached(int64_t tokens, Masking masking) {
  const Problem<T> problem(tokens, masking);
  const auto streamed = run(problem, true);
  const auto cached = run(problem, false);
  const char* names[] = {"o",      "grad_q",          "grad_k",     "grad_v",
                         "grad_w", "saved_summaries", "saved_mixed"};
  for (size_t i = 0; i < streamed.size(); ++i) EXPECT_TRUE(streamed[i] == cached[i]) << names[i];
}

TEST(StreamedResults, FloatMatchesWritingThroughTheCache) {
  expect_streamed_equals_cached<float>(int64_t(1) << 17, Masking::none);
  expect_streamed_equals_cached<float>(int64_t(1) << 17, Masking::causal);
}

TEST(StreamedResults, Bfloat16MatchesWritingThroughTheCache) {
  expect_streamed_equals_cached<bfloat16>(int64_t(1) << 18, Masking::none);
}

}  // namespace
}  // namespace mhla::test
