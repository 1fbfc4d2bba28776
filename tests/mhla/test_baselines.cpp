// Baselines: linear attention must equal MHLA with one block and w = [[1]];
// the tiled softmax must equal the dense softmax reference, whose gradient is
// itself checked against finite differences.
#include "test_support.hpp"

namespace mhla::test {
namespace {

class LinearAttention : public testing::TestWithParam<Case> {};

TEST_P(LinearAttention, EqualsSingleBlockMhlaReference) {
  Case c = GetParam();
  const int64_t n = c.tokens();
  c.layout = TokenLayout::sequence(n, n);  // one block
  c.per_head = false;
  Inputs in = make_inputs(c, 5);
  in.w = {1.0};
  std::vector<double> want_o(in.v.size()), gq(in.q.size()), gk(in.k.size()), gv(in.v.size()), gw(1);
  reference::block_forward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                           view(in.v, c.v_shape()), view(in.w, {1, 1}), view(want_o, c.v_shape()));
  reference::block_backward(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                            view(in.v, c.v_shape()), view(in.w, {1, 1}),
                            view(in.grad_o, c.v_shape()), view(gq, c.q_shape()),
                            view(gk, c.q_shape()), view(gv, c.v_shape()), view(gw, {1, 1}));

  const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
             g = cast<float>(in.grad_o);
  std::vector<float> o(v.size()), fq(q.size()), fk(k.size()), fv(v.size());
  const LinearAttentionOptions opts = c.options();
  linear_attention_forward<float>(opts, view(q, c.q_shape()), view(k, c.q_shape()),
                                  view(v, c.v_shape()), view(o, c.v_shape()));
  EXPECT_CLOSE(o, want_o, 2e-4, "forward");
  linear_attention_backward<float>(
      opts, view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()), view(o, c.v_shape()),
      view(g, c.v_shape()), view(fq, c.q_shape()), view(fk, c.q_shape()), view(fv, c.v_shape()));
  EXPECT_CLOSE(fq, gq, 2e-4, "grad q");
  EXPECT_CLOSE(fk, gk, 2e-4, "grad k");
  EXPECT_CLOSE(fv, gv, 2e-4, "grad v");
}

std::vector<Case> linear_cases() {
  std::vector<Case> out;
  // 300 and 531 tokens span several internal chunks (64 causal, 256 otherwise).
  for (int64_t n : {1, 5, 300, 531})
    for (Masking masking : {Masking::none, Masking::causal})
      for (FeatureMap phi : {FeatureMap::identity, FeatureMap::relu, FeatureMap::elu1})
        for (bool normalize : {true, false}) {
          // (Appending rather than "n" + to_string(n) avoids GCC 12's false -Wrestrict.)
          std::string name = "n";
          name += std::to_string(n);
          Case c{name, 2, 2, 7, 5, TokenLayout::sequence(n, n), masking, phi, normalize};
          out.push_back(c);
        }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, LinearAttention, testing::ValuesIn(linear_cases()), case_name);

struct SoftmaxCase {
  std::string name;
  int64_t batch, tokens, heads, dk, dv;
  bool causal;
};

class SoftmaxAttention : public testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxAttention, TiledMatchesDenseReference) {
  const SoftmaxCase& s = GetParam();
  std::mt19937_64 rng(17);
  const std::vector<int64_t> qs = {s.batch, s.tokens, s.heads, s.dk};
  const std::vector<int64_t> vs = {s.batch, s.tokens, s.heads, s.dv};
  // Logits of a few units so the softmax is far from uniform.
  const auto q = uniform(numel(qs), -2, 2, rng), k = uniform(numel(qs), -2, 2, rng),
             v = uniform(numel(vs), -1, 1, rng), g = uniform(numel(vs), -1, 1, rng);
  SoftmaxOptions opts;
  opts.causal = s.causal;
  std::vector<double> want_o(v.size()), gq(q.size()), gk(k.size()), gv(v.size());
  reference::softmax_forward(opts, view(q, qs), view(k, qs), view(v, vs), view(want_o, vs));
  reference::softmax_backward(opts, view(q, qs), view(k, qs), view(v, vs), view(g, vs),
                              view(gq, qs), view(gk, qs), view(gv, vs));

  const auto fq = cast<float>(q), fk = cast<float>(k), fv = cast<float>(v), fg = cast<float>(g);
  std::vector<float> o(v.size()), lse(s.batch * s.heads * s.tokens), dq(q.size()), dk(k.size()),
      dv(v.size());
  const std::vector<int64_t> ls = {s.batch, s.heads, s.tokens};
  softmax_attention_forward<float>(opts, view(fq, qs), view(fk, qs), view(fv, vs), view(o, vs),
                                   view(lse, ls));
  EXPECT_CLOSE(o, want_o, 1e-5, "forward");
  softmax_attention_backward<float>(opts, view(fq, qs), view(fk, qs), view(fv, vs), view(o, vs),
                                    view(lse, ls), view(fg, vs), view(dq, qs), view(dk, qs),
                                    view(dv, vs));
  EXPECT_CLOSE(dq, gq, 1e-4, "grad q");
  EXPECT_CLOSE(dk, gk, 1e-4, "grad k");
  EXPECT_CLOSE(dv, gv, 1e-4, "grad v");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxAttention,
                         testing::Values(SoftmaxCase{"one_token", 1, 1, 1, 3, 2, false},
                                         SoftmaxCase{"one_token_causal", 1, 1, 1, 3, 2, true},
                                         SoftmaxCase{"ragged", 2, 77, 3, 5, 7, false},
                                         SoftmaxCase{"ragged_causal", 2, 77, 3, 5, 7, true},
                                         // Several query and key tiles (64 x 256), odd head dims.
                                         SoftmaxCase{"multi_tile", 1, 600, 2, 59, 3, false},
                                         SoftmaxCase{"multi_tile_causal", 1, 600, 2, 3, 59, true}),
                         [](const auto& info) { return info.param.name; });

TEST(SoftmaxReference, GradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    std::mt19937_64 rng(23);
    const std::vector<int64_t> qs = {1, 6, 2, 3}, vs = {1, 6, 2, 2};
    auto q = uniform(numel(qs), -1, 1, rng), k = uniform(numel(qs), -1, 1, rng),
         v = uniform(numel(vs), -1, 1, rng);
    const auto g = uniform(numel(vs), -1, 1, rng);
    SoftmaxOptions opts;
    opts.causal = causal;
    std::vector<double> gq(q.size()), gk(k.size()), gv(v.size());
    reference::softmax_backward(opts, view(q, qs), view(k, qs), view(v, vs), view(g, vs),
                                view(gq, qs), view(gk, qs), view(gv, vs));
    auto loss = [&]() {
      std::vector<double> o(v.size());
      reference::softmax_forward(opts, view(q, qs), view(k, qs), view(v, vs), view(o, vs));
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += o[i] * g[i];
      return l;
    };
    auto numeric = [&](std::vector<double>& x) {
      std::vector<double> out(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + 1e-6;
        const double up = loss();
        x[i] = saved - 1e-6;
        const double down = loss();
        x[i] = saved;
        out[i] = (up - down) / 2e-6;
      }
      return out;
    };
    EXPECT_CLOSE(numeric(q), gq, 1e-6, "grad q");
    EXPECT_CLOSE(numeric(k), gk, 1e-6, "grad k");
    EXPECT_CLOSE(numeric(v), gv, 1e-6, "grad v");
  }
}

}  // namespace
}  // namespace mhla::test
