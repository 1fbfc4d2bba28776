// Packed variable-length batches must equal running each sequence alone, in
// every 1D masking and with dense (shared, per-head) or Toeplitz mixing.
#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;

struct Packed {
  std::vector<int64_t> cu;  // cu_seqlens
  int64_t heads, dk, dv;
  std::vector<double> q, k, v, grad_o;
  int64_t total() const { return cu.back(); }
  std::vector<int64_t> qs() const { return {1, total(), heads, dk}; }
  std::vector<int64_t> vs() const { return {1, total(), heads, dv}; }
};

Packed make_packed(std::vector<int64_t> lengths, int64_t heads, int64_t dk, int64_t dv,
                   uint64_t seed) {
  Packed p{{0}, heads, dk, dv, {}, {}, {}, {}};
  for (int64_t len : lengths) p.cu.push_back(p.cu.back() + len);
  std::mt19937_64 rng(seed);
  p.q = uniform(p.total() * heads * dk, -1, 1, rng);
  p.k = uniform(p.total() * heads * dk, -1, 1, rng);
  p.v = uniform(p.total() * heads * dv, -1, 1, rng);
  p.grad_o = uniform(p.total() * heads * dv, -1, 1, rng);
  return p;
}

struct Outputs {
  std::vector<double> o, gq, gk, gv, gw;
};

// Rows [first, first + count) of a packed [1, total, H, width] tensor.
std::vector<double> rows(const std::vector<double>& x, int64_t heads, int64_t width, int64_t first,
                         int64_t count) {
  return {x.begin() + first * heads * width, x.begin() + (first + count) * heads * width};
}

// Each sequence alone through forward/backward, outputs placed back in packed
// order and w's gradients summed into w's shape.
Outputs one_by_one(const VarlenOptions& vo, const Packed& p, const std::vector<double>& w,
                   const std::vector<int64_t>& ws) {
  Outputs out{std::vector<double>(p.v.size()), std::vector<double>(p.q.size()),
              std::vector<double>(p.k.size()), std::vector<double>(p.v.size()),
              std::vector<double>(w.size(), 0.0)};
  for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
    const int64_t first = p.cu[s], n = p.cu[s + 1] - p.cu[s];
    if (n == 0) continue;
    Options o;
    static_cast<LinearAttentionOptions&>(o) = vo;
    o.mixing = vo.mixing;
    o.layout = TokenLayout::sequence(n, vo.block);
    const int64_t m = o.layout.num_blocks();
    std::vector<double> sw = w;
    std::vector<int64_t> sws = ws;
    const bool dense = vo.mixing == MixingForm::dense;
    const int64_t big = ws.back(), copies = ws.size() == 3 ? ws[0] : 1;
    if (dense) {
      sw.assign(copies * m * m, 0.0);
      for (int64_t c = 0; c < copies; ++c)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t b = 0; b < m; ++b) sw[(c * m + i) * m + b] = w[(c * big + i) * big + b];
      sws = copies > 1 ? std::vector<int64_t>{copies, m, m} : std::vector<int64_t>{m, m};
    }
    const auto q = rows(p.q, p.heads, p.dk, first, n), k = rows(p.k, p.heads, p.dk, first, n),
               v = rows(p.v, p.heads, p.dv, first, n), g = rows(p.grad_o, p.heads, p.dv, first, n);
    const std::vector<int64_t> qs = {1, n, p.heads, p.dk}, vs = {1, n, p.heads, p.dv};
    std::vector<double> o_s(v.size()), gq(q.size()), gk(k.size()), gv(v.size()), gw(sw.size());
    forward<double>(o, view(q, qs), view(k, qs), view(v, vs), view(sw, sws), view(o_s, vs));
    backward<double>(o, view(q, qs), view(k, qs), view(v, vs), view(sw, sws), view(o_s, vs),
                     view(g, vs), view(gq, qs), view(gk, qs), view(gv, vs), view(gw, sws));
    std::copy(o_s.begin(), o_s.end(), out.o.begin() + first * p.heads * p.dv);
    std::copy(gq.begin(), gq.end(), out.gq.begin() + first * p.heads * p.dk);
    std::copy(gk.begin(), gk.end(), out.gk.begin() + first * p.heads * p.dk);
    std::copy(gv.begin(), gv.end(), out.gv.begin() + first * p.heads * p.dv);
    if (!dense) {
      for (size_t e = 0; e < gw.size(); ++e) out.gw[e] += gw[e];
      continue;
    }
    for (int64_t c = 0; c < copies; ++c)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t b = 0; b < m; ++b) out.gw[(c * big + i) * big + b] += gw[(c * m + i) * m + b];
  }
  return out;
}

Outputs packed_run(const VarlenOptions& vo, const Packed& p, const std::vector<double>& w,
                   const std::vector<int64_t>& ws) {
  Outputs out{std::vector<double>(p.v.size()), std::vector<double>(p.q.size()),
              std::vector<double>(p.k.size()), std::vector<double>(p.v.size()),
              std::vector<double>(w.size())};
  const TensorView<const int64_t> cu{p.cu.data(), {int64_t(p.cu.size())}};
  varlen_forward<double>(vo, cu, view(p.q, p.qs()), view(p.k, p.qs()), view(p.v, p.vs()),
                         view(w, ws), view(out.o, p.vs()));
  varlen_backward<double>(vo, cu, view(p.q, p.qs()), view(p.k, p.qs()), view(p.v, p.vs()),
                          view(w, ws), view(out.o, p.vs()), view(p.grad_o, p.vs()),
                          view(out.gq, p.qs()), view(out.gk, p.qs()), view(out.gv, p.vs()),
                          view(out.gw, ws));
  return out;
}

TEST(Varlen, EqualsEachSequenceAlone) {
  // Ragged lengths, an empty sequence, a one-token one, one filling whole blocks.
  const Packed p = make_packed({13, 0, 5, 1, 8, 22}, 2, 3, 4, 7);
  for (Masking masking : {Masking::none, Masking::causal, Masking::block_causal})
    for (const char* mixing : {"dense-shared", "dense-per-head", "toeplitz"}) {
      const bool toeplitz = std::string(mixing) == "toeplitz";
      if (toeplitz && masking == Masking::none) continue;
      for (bool normalize : {true, false}) {
        SCOPED_TRACE(std::string(to_string(masking)) + " " + mixing +
                     (normalize ? " normalized" : " unnormalized"));
        VarlenOptions vo;
        vo.block = 4;
        vo.masking = masking;
        vo.feature_map = FeatureMap::elu1;
        vo.normalize = normalize;
        vo.mixing = toeplitz ? MixingForm::toeplitz : MixingForm::dense;
        const int64_t m = 7;  // > 6 blocks of the longest sequence: corners are used
        std::vector<int64_t> ws = {m, m};
        if (std::string(mixing) == "dense-per-head") ws = {2, m, m};
        if (toeplitz) ws = {3};
        std::mt19937_64 rng(1);
        const auto w = uniform(numel(ws), 0.05, 1.0, rng);
        const Outputs want = one_by_one(vo, p, w, ws), got = packed_run(vo, p, w, ws);
        EXPECT_CLOSE(got.o, want.o, 1e-13, "o");
        EXPECT_CLOSE(got.gq, want.gq, 1e-13, "grad q");
        EXPECT_CLOSE(got.gk, want.gk, 1e-13, "grad k");
        EXPECT_CLOSE(got.gv, want.gv, 1e-13, "grad v");
        EXPECT_CLOSE(got.gw, want.gw, 1e-13, "grad w");
        if (!toeplitz) {  // the last row of w lies beyond every corner
          for (int64_t i = 0; i < m; ++i) EXPECT_EQ(got.gw[(m - 1) * m + i], 0.0);
        }
      }
    }
}

// Tokens of one sequence never reach another: changing sequence 0 leaves the
// outputs of sequence 1 bit-identical.
TEST(Varlen, SequencesDoNotSeeEachOther) {
  Packed p = make_packed({9, 6}, 1, 2, 2, 3);
  VarlenOptions vo;
  vo.block = 4;
  const std::vector<double> w(9, 0.5);
  const TensorView<const int64_t> cu{p.cu.data(), {3}};
  std::vector<double> before(p.v.size()), after(p.v.size());
  varlen_forward<double>(vo, cu, view(p.q, p.qs()), view(p.k, p.qs()), view(p.v, p.vs()),
                         view(w, {3, 3}), view(before, p.vs()));
  for (int64_t e = 0; e < 9 * 2; ++e) p.k[e] += 1.0, p.v[e] -= 2.0;
  varlen_forward<double>(vo, cu, view(p.q, p.qs()), view(p.k, p.qs()), view(p.v, p.vs()),
                         view(w, {3, 3}), view(after, p.vs()));
  EXPECT_EQ(std::vector<double>(before.begin() + 18, before.end()),
            std::vector<double>(after.begin() + 18, after.end()));
  EXPECT_NE(before[0], after[0]);
}

TEST(Varlen, BadPackingIsAClearError) {
  const Packed p = make_packed({5, 7}, 1, 2, 2, 3);
  VarlenOptions vo;
  vo.block = 4;
  const std::vector<double> w(4, 0.5);
  std::vector<double> o(p.v.size());
  auto error_of = [&](std::vector<int64_t> cu, std::vector<int64_t> ws,
                      std::vector<int64_t> qs) -> std::string {
    const std::vector<int64_t> vs = {qs[0], qs[1], qs[2], p.dv};
    try {
      varlen_forward<double>(vo, {cu.data(), {int64_t(cu.size())}}, view(p.q, qs), view(p.k, qs),
                             view(p.v, vs), view(w, ws), view(o, vs));
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::vector<int64_t> ws = {2, 2};
  EXPECT_EQ(error_of({0, 5, 12}, ws, p.qs()), "no error");
  EXPECT_THAT(error_of({1, 5, 12}, ws, p.qs()), HasSubstr("cu_seqlens[0] must be 0, got 1"));
  EXPECT_THAT(
      error_of({0, 7, 5, 12}, ws, p.qs()),
      HasSubstr("cu_seqlens must be non-decreasing, but cu_seqlens[2] = 5 < cu_seqlens[1] = 7"));
  EXPECT_THAT(error_of({0, 5, 11}, ws, p.qs()),
              HasSubstr("cu_seqlens ends at 11 but the packed tensors hold N = 12 tokens"));
  EXPECT_THAT(error_of({0}, ws, p.qs()), HasSubstr("cu_seqlens needs S + 1 >= 2 offsets"));
  EXPECT_THAT(error_of({0, 5, 12}, {1, 1}, p.qs()),
              HasSubstr("w covers 1 blocks (4 tokens in blocks of 4) but the longest sequence "
                        "has 7 tokens = 2 blocks"));
  EXPECT_THAT(error_of({0, 5, 12}, ws, {2, 6, 1, 2}), HasSubstr("packed q must have batch 1"));
  std::vector<double> negative = {0.5, 0.5, -1.0, 0.5};
  std::vector<int64_t> cu = {0, 5, 12};
  try {
    varlen_forward<double>(vo, {cu.data(), {3}}, view(p.q, p.qs()), view(p.k, p.qs()),
                           view(p.v, p.vs()), view(negative, {2, 2}), view(o, p.vs()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                HasSubstr("mhla::varlen_forward: w[1, 0] = -1.000000 is negative"));
  }
}

}  // namespace
}  // namespace mhla::test
