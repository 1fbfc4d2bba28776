// The public phase functions: each phase against its definition, the phases
// chained equal to forward/backward on every case of the catalogue, and a
// sequence processed in pieces (state in, state out) equal to one call.
#include <algorithm>

#include "mhla/phases.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

constexpr double kExact = 1e-12;  // fp64: the same sums in another order

std::vector<int64_t> summary_shape(const Case& c, int64_t blocks) {
  return {c.batch, c.heads, blocks, c.dk, c.dv + 1};
}

double feature(FeatureMap phi, double x) {
  switch (phi) {
    case FeatureMap::identity:
      return x;
    case FeatureMap::relu:
      return std::max(x, 0.0);
    case FeatureMap::elu1:
      return x > 0 ? x + 1 : std::exp(x);
  }
  return x;
}

// [S_b | z_b] = sum over the block's tokens of phi(k_t) [v_t | 1]^T.
std::vector<double> summaries_by_definition(const Case& c, const Inputs& in) {
  const int64_t n = c.tokens(), x1 = c.dv + 1;
  std::vector<double> s(numel(summary_shape(c, c.blocks())), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t blk = c.layout.block_of(t);
        double* out = s.data() + ((b * c.heads + h) * c.blocks() + blk) * c.dk * x1;
        for (int64_t i = 0; i < c.dk; ++i) {
          const double f = feature(c.phi, in.k[((b * n + t) * c.heads + h) * c.dk + i]);
          for (int64_t e = 0; e < c.dv; ++e)
            out[i * x1 + e] += f * in.v[((b * n + t) * c.heads + h) * c.dv + e];
          out[i * x1 + c.dv] += f;
        }
      }
  return s;
}

// W[i, b] of head h, 0 where the masking does not let block i read block b
// (causal: the diagonal acts in the read-out, not in the mix).
double mixing_weight(const Case& c, const std::vector<double>& w, int64_t h, int64_t i, int64_t b) {
  if (c.masking == Masking::causal && b >= i) return 0;
  if (c.masking == Masking::block_causal && b > i) return 0;
  if (c.toeplitz_length >= 0) {
    const int64_t len = c.toeplitz_length;
    return w[(c.per_head ? h * (len + 1) : 0) + std::min(i - b, len)];
  }
  const int64_t m = c.blocks();
  return w[((c.per_head ? h : 0) * m + i) * m + b];
}

std::vector<double> mix_by_definition(const Case& c, const std::vector<double>& w,
                                      const std::vector<double>& s) {
  const int64_t m = c.blocks(), x = c.dk * (c.dv + 1);
  std::vector<double> mixed(s.size(), 0.0);
  for (int64_t bh = 0; bh < c.batch * c.heads; ++bh)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = 0; b < m; ++b) {
        const double wib = mixing_weight(c, w, bh % c.heads, i, b);
        for (int64_t e = 0; e < x; ++e)
          mixed[(bh * m + i) * x + e] += wib * s[(bh * m + b) * x + e];
      }
  return mixed;
}

// The cases run in loops inside a few tests rather than as one CTest entry
// each: a test process per case cost more than the cases themselves.
void each_phase_matches_its_definition_and_they_chain_to_forward(const Case& c) {
  const Inputs in = make_inputs(c, 7);
  const Options opt = c.options();
  const auto ss = summary_shape(c, c.blocks());
  std::vector<double> s(numel(ss)), mixed(numel(ss)), o(in.v.size()), want_o(in.v.size());
  block_summaries<double>(opt, view(in.k, c.q_shape()), view(in.v, c.v_shape()), view(s, ss));
  EXPECT_CLOSE(s, summaries_by_definition(c, in), kExact, "summaries");
  mix_summaries<double>(opt, view(in.w, c.w_shape()), view(s, ss), view(mixed, ss));
  EXPECT_CLOSE(mixed, mix_by_definition(c, in.w, s), kExact, "mixed");
  read_out<double>(opt, view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
                   view(in.w, c.w_shape()), view(mixed, ss), view(o, c.v_shape()));
  forward<double>(opt, view(in.q, c.q_shape()), view(in.k, c.q_shape()), view(in.v, c.v_shape()),
                  view(in.w, c.w_shape()), view(want_o, c.v_shape()));
  EXPECT_CLOSE(o, want_o, kExact, "read-out vs forward");
}

void backward_phases_chain_to_backward(const Case& c) {
  const Inputs in = make_inputs(c, 8);
  const Options opt = c.options();
  const auto ss = summary_shape(c, c.blocks());
  const auto qs = c.q_shape(), vs = c.v_shape(), ws = c.w_shape();
  std::vector<double> o(in.v.size()), gq(in.q.size()), gk(in.k.size()), gv(in.v.size()),
      gw(in.w.size());
  forward<double>(opt, view(in.q, qs), view(in.k, qs), view(in.v, vs), view(in.w, ws), view(o, vs));
  backward<double>(opt, view(in.q, qs), view(in.k, qs), view(in.v, vs), view(in.w, ws), view(o, vs),
                   view(in.grad_o, vs), view(gq, qs), view(gk, qs), view(gv, vs), view(gw, ws));

  std::vector<double> s(numel(ss)), mixed(numel(ss));
  block_summaries<double>(opt, view(in.k, qs), view(in.v, vs), view(s, ss));
  mix_summaries<double>(opt, view(in.w, ws), view(s, ss), view(mixed, ss));
  // The backward phases add to zeroed buffers.
  std::vector<double> pq(gq.size(), 0.0), pk(gk.size(), 0.0), pv(gv.size(), 0.0),
      pw(gw.size(), 0.0), dmixed(mixed.size(), 0.0), ds(s.size(), 0.0);
  read_out_backward<double>(opt, view(in.q, qs), view(in.k, qs), view(in.v, vs), view(in.w, ws),
                            view(mixed, ss), view(o, vs), view(in.grad_o, vs), view(pq, qs),
                            view(pk, qs), view(pv, vs), view(dmixed, ss), view(pw, ws));
  mix_summaries_backward<double>(opt, view(in.w, ws), view(s, ss), view(dmixed, ss), view(ds, ss),
                                 view(pw, ws));
  block_summaries_backward<double>(opt, view(in.k, qs), view(in.v, vs), view(ds, ss), view(pk, qs),
                                   view(pv, vs));
  EXPECT_CLOSE(pq, gq, kExact, "grad q");
  EXPECT_CLOSE(pk, gk, kExact, "grad k");
  EXPECT_CLOSE(pv, gv, kExact, "grad v");
  EXPECT_CLOSE(pw, gw, kExact, "grad w");
}

TEST(Phases, EachPhaseMatchesItsDefinitionAndTheyChainToForward) {
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label() + " " + c.layout.describe());
    each_phase_matches_its_definition_and_they_chain_to_forward(c);
  }
}

TEST(Phases, BackwardPhasesChainToBackward) {
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label() + " " + c.layout.describe());
    backward_phases_chain_to_backward(c);
  }
}

// The 1D masked cases, where a sequence can be cut into pieces.
std::vector<Case> piece_cases() {
  std::vector<Case> out;
  for (const Case& c : all_mode_cases())
    if (c.layout.rank() == 1 && c.masking != Masking::none && c.blocks() > 1) out.push_back(c);
  return out;
}

// Piece boundaries at random whole blocks: first blocks of each piece, then M.
std::vector<int64_t> piece_starts(int64_t blocks, std::mt19937_64& rng) {
  std::vector<int64_t> starts = {0};
  for (int64_t b = 1; b < blocks; ++b)
    if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) starts.push_back(b);
  if (starts.size() == 1) starts.push_back(blocks / 2);
  starts.push_back(blocks);
  return starts;
}

// A piece's view of the whole problem: its tokens, and w covering blocks
// 0 .. end - 1 (dense: the top-left corner).
struct Piece {
  Options options;
  int64_t first_token, tokens, first_block, blocks;
  std::vector<double> w;
  std::vector<int64_t> w_shape;
};

Piece make_piece(const Case& c, const std::vector<double>& w, int64_t first_block, int64_t end) {
  const int64_t block = c.layout.tile()[2], n = c.tokens();
  Piece p;
  p.first_block = first_block;
  p.blocks = end - first_block;
  p.first_token = first_block * block;
  p.tokens = std::min(n, end * block) - p.first_token;
  p.options = c.options();
  p.options.layout = TokenLayout::sequence(p.tokens, block);
  if (c.toeplitz_length >= 0) {
    p.w = w;
    p.w_shape = c.w_shape();
    return p;
  }
  const int64_t m = c.blocks(), copies = c.per_head ? c.heads : 1;
  for (int64_t h = 0; h < copies; ++h)
    for (int64_t i = 0; i < end; ++i)
      for (int64_t b = 0; b < end; ++b) p.w.push_back(w[(h * m + i) * m + b]);
  p.w_shape = c.per_head ? std::vector<int64_t>{c.heads, end, end} : std::vector<int64_t>{end, end};
  return p;
}

// Rows first .. first + tokens - 1 of [B, N, H, D], copied out, or added back.
std::vector<double> rows_of(const std::vector<double>& x, const Case& c, int64_t width,
                            int64_t first, int64_t tokens) {
  std::vector<double> out;
  const int64_t row = c.heads * width;
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto start = x.begin() + (b * c.tokens() + first) * row;
    out.insert(out.end(), start, start + tokens * row);
  }
  return out;
}
void add_rows(const std::vector<double>& part, const Case& c, int64_t width, int64_t first,
              int64_t tokens, std::vector<double>& x) {
  const int64_t row = c.heads * width;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t e = 0; e < tokens * row; ++e)
      x[(b * c.tokens() + first) * row + e] += part[b * tokens * row + e];
}

void forward_in_pieces_with_state_equals_one_call(const Case& c) {
  const Inputs in = make_inputs(c, 11);
  std::vector<double> want(in.v.size()), got(in.v.size(), 0.0);
  forward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                  view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(want, c.v_shape()));
  std::mt19937_64 rng(5);
  const std::vector<int64_t> starts = piece_starts(c.blocks(), rng);
  std::vector<double> state;  // [B, H, P, Dk, Dv + 1]
  for (size_t j = 0; j + 1 < starts.size(); ++j) {
    const Piece p = make_piece(c, in.w, starts[j], starts[j + 1]);
    const std::vector<int64_t> qs = {c.batch, p.tokens, c.heads, c.dk},
                               vs = {c.batch, p.tokens, c.heads, c.dv};
    const auto q = rows_of(in.q, c, c.dk, p.first_token, p.tokens);
    const auto k = rows_of(in.k, c, c.dk, p.first_token, p.tokens);
    const auto v = rows_of(in.v, c, c.dv, p.first_token, p.tokens);
    std::vector<double> o(v.size()), next(numel(summary_shape(c, starts[j + 1])));
    forward_piece<double>(p.options, view(q, qs), view(k, qs), view(v, vs), view(p.w, p.w_shape),
                          view(state, summary_shape(c, p.first_block)), view(o, vs),
                          view(next, summary_shape(c, starts[j + 1])));
    add_rows(o, c, c.dv, p.first_token, p.tokens, got);
    state = std::move(next);
  }
  EXPECT_CLOSE(got, want, kExact, "outputs of " << starts.size() - 1 << " pieces");
}

// The backward phases at an offset (first_block > 0), as a context-parallel
// layer runs them: per piece read-out and mix backward against the summaries
// of every block up to the piece's end, summed, give backward on the whole.
void backward_in_pieces_equals_one_call(const Case& c) {
  const Inputs in = make_inputs(c, 12);
  const auto qs = c.q_shape(), vs = c.v_shape(), ws = c.w_shape();
  const auto all = summary_shape(c, c.blocks());
  std::vector<double> o(in.v.size()), gq(in.q.size()), gk(in.k.size()), gv(in.v.size()),
      gw(in.w.size()), s(numel(all));
  forward<double>(c.options(), view(in.q, qs), view(in.k, qs), view(in.v, vs), view(in.w, ws),
                  view(o, vs));
  backward<double>(c.options(), view(in.q, qs), view(in.k, qs), view(in.v, vs), view(in.w, ws),
                   view(o, vs), view(in.grad_o, vs), view(gq, qs), view(gk, qs), view(gv, vs),
                   view(gw, ws));
  block_summaries<double>(c.options(), view(in.k, qs), view(in.v, vs), view(s, all));

  std::mt19937_64 rng(6);
  const std::vector<int64_t> starts = piece_starts(c.blocks(), rng);
  const int64_t x = c.dk * (c.dv + 1), m = c.blocks();
  std::vector<double> pq(gq.size(), 0.0), pk(gk.size(), 0.0), pv(gv.size(), 0.0),
      pw(gw.size(), 0.0), ds(s.size(), 0.0);
  for (size_t j = 0; j + 1 < starts.size(); ++j) {
    const int64_t end = starts[j + 1];
    const Piece p = make_piece(c, in.w, starts[j], end);
    const std::vector<int64_t> pqs = {c.batch, p.tokens, c.heads, c.dk},
                               pvs = {c.batch, p.tokens, c.heads, c.dv};
    const auto q = rows_of(in.q, c, c.dk, p.first_token, p.tokens);
    const auto k = rows_of(in.k, c, c.dk, p.first_token, p.tokens);
    const auto v = rows_of(in.v, c, c.dv, p.first_token, p.tokens);
    const auto po = rows_of(o, c, c.dv, p.first_token, p.tokens);
    const auto g = rows_of(in.grad_o, c, c.dv, p.first_token, p.tokens);
    // The summaries of blocks 0 .. end - 1, and the piece's mix of them.
    std::vector<double> prefix;
    for (int64_t bh = 0; bh < c.batch * c.heads; ++bh)
      prefix.insert(prefix.end(), s.begin() + bh * m * x, s.begin() + (bh * m + end) * x);
    std::vector<double> mixed(numel(summary_shape(c, p.blocks)));
    mix_summaries<double>(p.options, view(p.w, p.w_shape), view(prefix, summary_shape(c, end)),
                          view(mixed, summary_shape(c, p.blocks)), p.first_block);
    std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0),
        dw(p.w.size(), 0.0), dmixed(mixed.size(), 0.0), dprefix(prefix.size(), 0.0);
    read_out_backward<double>(p.options, view(q, pqs), view(k, pqs), view(v, pvs),
                              view(p.w, p.w_shape), view(mixed, summary_shape(c, p.blocks)),
                              view(po, pvs), view(g, pvs), view(dq, pqs), view(dk, pqs),
                              view(dv, pvs), view(dmixed, summary_shape(c, p.blocks)),
                              view(dw, p.w_shape), p.first_block);
    mix_summaries_backward<double>(
        p.options, view(p.w, p.w_shape), view(prefix, summary_shape(c, end)),
        view(dmixed, summary_shape(c, p.blocks)), view(dprefix, summary_shape(c, end)),
        view(dw, p.w_shape), p.first_block);
    add_rows(dq, c, c.dk, p.first_token, p.tokens, pq);
    add_rows(dk, c, c.dk, p.first_token, p.tokens, pk);
    add_rows(dv, c, c.dv, p.first_token, p.tokens, pv);
    for (int64_t bh = 0; bh < c.batch * c.heads; ++bh)
      for (int64_t e = 0; e < end * x; ++e) ds[bh * m * x + e] += dprefix[bh * end * x + e];
    if (c.toeplitz_length >= 0) {
      for (size_t e = 0; e < dw.size(); ++e) pw[e] += dw[e];
    } else {
      for (int64_t h = 0; h < (c.per_head ? c.heads : 1); ++h)
        for (int64_t i = 0; i < end; ++i)
          for (int64_t b = 0; b < end; ++b) pw[(h * m + i) * m + b] += dw[(h * end + i) * end + b];
    }
  }
  block_summaries_backward<double>(c.options(), view(in.k, qs), view(in.v, vs), view(ds, all),
                                   view(pk, qs), view(pv, vs));
  EXPECT_CLOSE(pq, gq, kExact, "grad q");
  EXPECT_CLOSE(pk, gk, kExact, "grad k");
  EXPECT_CLOSE(pv, gv, kExact, "grad v");
  EXPECT_CLOSE(pw, gw, kExact, "grad w");
}

TEST(Pieces, ForwardInPiecesWithStateEqualsOneCall) {
  for (const Case& c : piece_cases()) {
    SCOPED_TRACE(c.label() + " " + c.layout.describe());
    forward_in_pieces_with_state_equals_one_call(c);
  }
}

TEST(Pieces, BackwardInPiecesEqualsOneCall) {
  for (const Case& c : piece_cases()) {
    SCOPED_TRACE(c.label() + " " + c.layout.describe());
    backward_in_pieces_equals_one_call(c);
  }
}

TEST(PhaseErrors, NameTheArgumentAndTheProblem) {
  const Case c{"1d", 1, 2, 3, 4, TokenLayout::sequence(12, 4), Masking::causal};
  const Inputs in = make_inputs(c, 1);
  const auto ss = summary_shape(c, 3);
  std::vector<double> s(numel(ss)), mixed(numel(ss)), o(in.v.size());
  const std::vector<double> w4(16, 0.5);
  using testing::HasSubstr;
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message([&] {
                mix_summaries<double>(c.options(), view(w4, {4, 4}), view(s, ss), view(mixed, ss));
              }),
              HasSubstr("mhla::mix_summaries: summaries hold 3 blocks but w has shape [4, 4]"));
  EXPECT_THAT(message([&] {
                mix_summaries<double>(c.options(), view(in.w, c.w_shape()), view(s, ss),
                                      view(mixed, ss), 1);
              }),
              HasSubstr("blocks 1 .. 3 (first_block 1, M = 3) exceed the 3 blocks that the "
                        "summaries hold"));
  EXPECT_THAT(message([&] {
                block_summaries<double>(c.options(), view(in.k, c.q_shape()),
                                        view(in.v, c.v_shape()), view(s, summary_shape(c, 2)));
              }),
              HasSubstr("mhla::block_summaries: summaries has shape [1, 2, 2, 3, 5], expected "
                        "[1, 2, 3, 3, 5]"));
  Options none = c.options();
  none.masking = Masking::none;
  std::vector<double> empty, next(numel(ss));
  EXPECT_THAT(message([&] {
                forward_piece<double>(none, view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                                      view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                                      view(empty, summary_shape(c, 0)), view(o, c.v_shape()),
                                      view(next, ss));
              }),
              HasSubstr("mhla::forward_piece: a piece of a sequence needs causal or block_causal"));
  EXPECT_THAT(message([&] {
                forward_piece<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                                      view(in.v, c.v_shape()), view(in.w, c.w_shape()),
                                      view(empty, {1, 2, 0, 3}), view(o, c.v_shape()),
                                      view(next, ss));
              }),
              HasSubstr("state_in must have rank 5 [B, H, P, Dk, Dv + 1], got shape [1, 2, 0, 3]"));
}

}  // namespace
}  // namespace mhla::test
