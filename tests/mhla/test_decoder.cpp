// The streaming decoder must reproduce the chunkwise causal forward on the
// whole sequence, whatever the prompt length, block size and boundary.
#include <limits>

#include "test_support.hpp"

namespace mhla::test {
namespace {

struct Sequence {
  int64_t tokens, heads, dk, dv;
  std::vector<float> q, k, v;
  // Rows of token t for one-token calls.
  std::vector<float> slice(const std::vector<float>& x, int64_t width, int64_t first,
                           int64_t count) const {
    return {x.begin() + first * heads * width, x.begin() + (first + count) * heads * width};
  }
};

Sequence make_sequence(int64_t n, int64_t heads, int64_t dk, int64_t dv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Sequence s{n, heads, dk, dv, {}, {}, {}};
  s.q = cast<float>(uniform(n * heads * dk, -1, 1, rng));
  s.k = cast<float>(uniform(n * heads * dk, -1, 1, rng));
  s.v = cast<float>(uniform(n * heads * dv, -1, 1, rng));
  return s;
}

// The chunkwise causal forward over the whole sequence: Toeplitz w as it is,
// dense w through its top-left corner.
std::vector<float> chunkwise(const DecoderOptions& d, const Sequence& s,
                             const std::vector<float>& w, int64_t w_blocks, bool per_head) {
  Options o;
  o.masking = Masking::causal;
  o.feature_map = d.feature_map;
  o.normalize = d.normalize;
  o.mixing = d.mixing;
  o.layout = TokenLayout::sequence(s.tokens, d.block);
  const int64_t m = o.layout.num_blocks(), copies = per_head ? s.heads : 1;
  std::vector<float> mixing = w;
  std::vector<int64_t> ws = per_head ? std::vector<int64_t>{s.heads, int64_t(w.size()) / s.heads}
                                     : std::vector<int64_t>{int64_t(w.size())};
  if (d.mixing == MixingForm::dense) {
    mixing.resize(copies * m * m);
    for (int64_t c = 0; c < copies; ++c)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t b = 0; b < m; ++b)
          mixing[(c * m + i) * m + b] = w[(c * w_blocks + i) * w_blocks + b];
    ws = per_head ? std::vector<int64_t>{s.heads, m, m} : std::vector<int64_t>{m, m};
  }
  std::vector<float> out(s.v.size());
  const std::vector<int64_t> qs = {1, s.tokens, s.heads, s.dk}, vs = {1, s.tokens, s.heads, s.dv};
  forward<float>(o, view(s.q, qs), view(s.k, qs), view(s.v, vs), view(mixing, ws), view(out, vs));
  return out;
}

// Prefill `prompt` tokens of sequence 0, then step through the rest.
std::vector<float> decode(Decoder& dec, const Sequence& s, int64_t prompt) {
  std::vector<float> out(s.v.size());
  if (prompt > 0) {
    const auto q = s.slice(s.q, s.dk, 0, prompt), k = s.slice(s.k, s.dk, 0, prompt),
               v = s.slice(s.v, s.dv, 0, prompt);
    std::vector<float> o(v.size());
    dec.prefill(0, view(q, {1, prompt, s.heads, s.dk}), view(k, {1, prompt, s.heads, s.dk}),
                view(v, {1, prompt, s.heads, s.dv}), view(o, {1, prompt, s.heads, s.dv}));
    std::copy(o.begin(), o.end(), out.begin());
  }
  for (int64_t t = prompt; t < s.tokens; ++t) {
    const auto q = s.slice(s.q, s.dk, t, 1), k = s.slice(s.k, s.dk, t, 1),
               v = s.slice(s.v, s.dv, t, 1);
    std::vector<float> o(v.size());
    dec.step(view(q, {1, 1, s.heads, s.dk}), view(k, {1, 1, s.heads, s.dk}),
             view(v, {1, 1, s.heads, s.dv}), view(o, {1, 1, s.heads, s.dv}));
    std::copy(o.begin(), o.end(), out.begin() + t * s.heads * s.dv);
  }
  return out;
}

std::vector<double> as_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

TEST(Decoder, PrefillPlusStepsEqualsChunkwiseForward) {
  const int64_t n = 29, heads = 2, dk = 5, dv = 4;
  const Sequence s = make_sequence(n, heads, dk, dv, 3);
  for (int64_t block : {1, 4, 7, 29, 40})
    for (bool normalize : {true, false})
      for (bool per_head : {false, true}) {
        DecoderOptions d;
        d.heads = heads;
        d.dk = dk;
        d.dv = dv;
        d.block = block;
        d.normalize = normalize;
        d.feature_map = normalize ? FeatureMap::elu1 : FeatureMap::relu;
        const int64_t m = (n + block - 1) / block + 2;  // room beyond the sequence
        std::mt19937_64 rng(block);
        const auto w = cast<float>(uniform((per_head ? heads : 1) * m * m, 0.05, 1.0, rng));
        const std::vector<int64_t> ws =
            per_head ? std::vector<int64_t>{heads, m, m} : std::vector<int64_t>{m, m};
        const auto want = as_double(chunkwise(d, s, w, m, per_head));
        // Prompts ending before, on and after block boundaries, empty and full.
        for (int64_t prompt :
             {int64_t(0), int64_t(1), block - 1, block, block + 1, 2 * block, n - 1, n}) {
          if (prompt < 0 || prompt > n) continue;
          SCOPED_TRACE("block " + std::to_string(block) + " prompt " + std::to_string(prompt) +
                       (normalize ? " normalized" : " unnormalized") +
                       (per_head ? " per-head" : " shared"));
          Decoder dec(d, view(w, ws));
          EXPECT_CLOSE(decode(dec, s, prompt), want, 2e-5, "decoded outputs");
          EXPECT_EQ(dec.position(0), n);
        }
      }
}

// Toeplitz mixing: L = 0 (tail only), 1 (no window), 2, 3 and 6 (a window of
// finished blocks, which wraps around its ring), and longer than the sequence
// (no tail ever used).
TEST(Decoder, ToeplitzPrefillPlusStepsEqualsChunkwiseForward) {
  const int64_t n = 41, heads = 2, dk = 4, dv = 3;
  const Sequence s = make_sequence(n, heads, dk, dv, 12);
  for (int64_t block : {1, 3, 8})
    for (int64_t length : {0, 1, 2, 3, 6, 50})
      for (bool per_head : {false, true}) {
        DecoderOptions d;
        d.heads = heads;
        d.dk = dk;
        d.dv = dv;
        d.block = block;
        d.mixing = MixingForm::toeplitz;
        std::mt19937_64 rng(length);
        const auto w = cast<float>(uniform((per_head ? heads : 1) * (length + 1), 0.05, 1.0, rng));
        const std::vector<int64_t> ws =
            per_head ? std::vector<int64_t>{heads, length + 1} : std::vector<int64_t>{length + 1};
        const auto want = as_double(chunkwise(d, s, w, 0, per_head));
        for (int64_t prompt : {int64_t(0), int64_t(1), block, 2 * block + 1, n - 1, n}) {
          SCOPED_TRACE("block " + std::to_string(block) + " L " + std::to_string(length) +
                       " prompt " + std::to_string(prompt) + (per_head ? " per-head" : " shared"));
          Decoder dec(d, view(w, ws));
          EXPECT_CLOSE(decode(dec, s, prompt), want, 2e-5, "decoded outputs");
        }
      }
}

// With Toeplitz mixing the context is unbounded and the state stops growing
// once L blocks are finished: the last L - 1 kept one by one, the rest summed.
TEST(Decoder, ToeplitzStateIsBounded) {
  DecoderOptions d;
  d.heads = 2;
  d.dk = 4;
  d.dv = 4;
  d.block = 4;
  d.mixing = MixingForm::toeplitz;
  const std::vector<float> w = {1.0f, 0.5f, 0.25f, 0.1f};  // L = 3
  Decoder dec(d, view(w, {4}));
  EXPECT_EQ(dec.max_tokens(), std::numeric_limits<int64_t>::max());
  const Sequence s = make_sequence(200, 2, 4, 4, 1);
  decode(dec, s, 100);
  // Per head: the L - 1 = 2 kept blocks, the tail sum, prefix and running
  // block; and one position. Dk = Dv = 4: rows of 16 floats and 16 key sums.
  ASSERT_EQ(dec.summary_bytes(), (4 * 16 + 16) * int64_t(sizeof(float)));
  EXPECT_EQ(dec.state_bytes(), (2 + 3) * 2 * dec.summary_bytes() + int64_t(sizeof(int64_t)));
}

TEST(Decoder, RecomputingTheMixEveryTokenGivesTheSameOutputs) {
  const Sequence s = make_sequence(23, 2, 4, 3, 9);
  DecoderOptions d;
  d.heads = 2;
  d.dk = 4;
  d.dv = 3;
  d.block = 5;
  const int64_t m = 5;
  const std::vector<float> w = init_mixing(TokenLayout::sequence(m * d.block, d.block),
                                           MixingInit{MixingTransform::linear, 1, 1.5, true});
  Decoder fast(d, view(w, {m, m}));
  d.recompute_mix_every_token = true;
  Decoder naive(d, view(w, {m, m}));
  EXPECT_CLOSE(decode(fast, s, 7), as_double(decode(naive, s, 7)), 1e-6, "outputs");
}

// Sequences of one batch at different positions: each must match decoding it alone.
TEST(Decoder, BatchedSequencesAtTheirOwnPositions) {
  const int64_t heads = 2, dk = 3, dv = 4, block = 4, m = 10, steps = 9;
  DecoderOptions d;
  d.batch = 3;
  d.heads = heads;
  d.dk = dk;
  d.dv = dv;
  d.block = block;
  const std::vector<float> w = init_mixing(TokenLayout::sequence(m * block, block),
                                           MixingInit{MixingTransform::linear, 1, 1.5, true});
  const std::vector<int64_t> prompts = {0, 5, 8};
  std::vector<Sequence> seqs;
  for (int64_t b = 0; b < 3; ++b)
    seqs.push_back(make_sequence(prompts[b] + steps, heads, dk, dv, 100 + b));

  Decoder batched(d, view(w, {m, m}));
  for (int64_t b = 0; b < 3; ++b)
    if (prompts[b] > 0) {
      const Sequence& s = seqs[b];
      const auto q = s.slice(s.q, dk, 0, prompts[b]), k = s.slice(s.k, dk, 0, prompts[b]),
                 v = s.slice(s.v, dv, 0, prompts[b]);
      std::vector<float> o(v.size());
      batched.prefill(b, view(q, {1, prompts[b], heads, dk}), view(k, {1, prompts[b], heads, dk}),
                      view(v, {1, prompts[b], heads, dv}), view(o, {1, prompts[b], heads, dv}));
    }
  std::vector<std::vector<float>> got(3);
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<float> q, k, v;
    for (int64_t b = 0; b < 3; ++b) {
      const Sequence& s = seqs[b];
      for (auto [dst, src, width] :
           {std::tuple{&q, &s.q, dk}, std::tuple{&k, &s.k, dk}, std::tuple{&v, &s.v, dv}}) {
        const auto row = s.slice(*src, width, prompts[b] + t, 1);
        dst->insert(dst->end(), row.begin(), row.end());
      }
    }
    std::vector<float> o(3 * heads * dv);
    batched.step(view(q, {3, 1, heads, dk}), view(k, {3, 1, heads, dk}), view(v, {3, 1, heads, dv}),
                 view(o, {3, 1, heads, dv}));
    for (int64_t b = 0; b < 3; ++b)
      got[b].insert(got[b].end(), o.begin() + b * heads * dv, o.begin() + (b + 1) * heads * dv);
  }
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_EQ(batched.position(b), prompts[b] + steps);
    DecoderOptions single = d;
    single.batch = 1;
    const auto want = chunkwise(single, seqs[b], w, m, false);
    const std::vector<float> tail(want.begin() + prompts[b] * heads * dv, want.end());
    EXPECT_CLOSE(got[b], as_double(tail), 2e-5, "sequence " << b);
  }
}

TEST(Decoder, StateGrowsPerBlockNotPerToken) {
  DecoderOptions d;
  d.heads = 2;
  d.dk = 4;
  d.dv = 4;
  d.block = 8;
  const std::vector<float> w(16 * 16, 0.1f);
  Decoder dec(d, view(w, {16, 16}));
  const Sequence s = make_sequence(64, 2, 4, 4, 1);
  decode(dec, s, 0);
  // 7 finished blocks + prefix + running, per head, plus one position.
  EXPECT_EQ(dec.state_bytes(), (7 + 2) * 2 * dec.summary_bytes() + int64_t(sizeof(int64_t)));
}

TEST(Decoder, ErrorsNameTheProblem) {
  DecoderOptions d;
  d.heads = 1;
  d.dk = 2;
  d.dv = 2;
  d.block = 2;
  const std::vector<float> w = {1, 0, 0.5f, 0.5f};
  Decoder dec(d, view(w, {2, 2}));
  const std::vector<float> q1(2, 0.1f), q5(10, 0.1f), o5(10), o1(2);
  // Prompt longer than the 4-token context.
  try {
    std::vector<float> q(10, 0.1f), o(10);
    dec.prefill(0, view(q, {1, 5, 1, 2}), view(q, {1, 5, 1, 2}), view(q, {1, 5, 1, 2}),
                view(o, {1, 5, 1, 2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                testing::HasSubstr("prompt of 5 tokens exceeds the context of 4"));
  }
  std::vector<float> o(2);
  for (int t = 0; t < 4; ++t)
    dec.step(view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}),
             view(o, {1, 1, 1, 2}));
  try {
    dec.step(view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}),
             view(o, {1, 1, 1, 2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                testing::HasSubstr("sequence 0 is full: its context holds 4 tokens"));
  }
  try {
    dec.prefill(0, view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}),
                view(o, {1, 1, 1, 2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), testing::HasSubstr("already holds 4 tokens"));
  }
  dec.reset(0);
  EXPECT_EQ(dec.position(0), 0);
  EXPECT_THROW(dec.step(view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 2}), view(q1, {1, 1, 1, 3}),
                        view(o, {1, 1, 1, 2})),
               Error);
  EXPECT_THROW(dec.position(1), Error);
  const std::vector<float> negative = {1, 0, -0.5f, 0.5f};
  EXPECT_THROW(Decoder(d, view(negative, {2, 2})), Error);
  const std::vector<float> not_square(6, 0.5f);
  EXPECT_THROW(Decoder(d, view(not_square, {2, 3})), Error);
  d.block = 0;
  EXPECT_THROW(Decoder(d, view(w, {2, 2})), Error);
  d.block = 2;
  d.dv = std::numeric_limits<int64_t>::max();  // dv + 1 would overflow
  EXPECT_THROW(Decoder(d, view(w, {2, 2})), Error);
}

}  // namespace
}  // namespace mhla::test
