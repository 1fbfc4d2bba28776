#include "random_call.hpp"

#include <cmath>
#include <limits>

#include "mhla/reference.hpp"

namespace mhla::fuzz {
namespace {

int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
bool chance(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

std::vector<double> values(std::mt19937_64& rng, int64_t n, double lo, double hi, double magnitude,
                           bool single) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& e : x) {
    e = dist(rng) * magnitude;
    if (single) e = double(float(e));
  }
  return x;
}

TokenLayout random_layout(std::mt19937_64& rng, int rank) {
  auto tile = [&](int64_t g) { return pick(rng, 1, g); };
  if (rank == 1) {
    const int64_t n = pick(rng, 1, 40);
    return TokenLayout::sequence(n, tile(n));
  }
  if (rank == 2) {
    const int64_t gh = pick(rng, 1, 7), gw = pick(rng, 1, 7);
    return TokenLayout::grid2d(gh, gw, tile(gh), tile(gw));
  }
  const int64_t gt = pick(rng, 1, 4), gh = pick(rng, 1, 4), gw = pick(rng, 1, 4);
  return TokenLayout::grid3d(gt, gh, gw, tile(gt), tile(gh), tile(gw));
}

// One element of k, v or w changed between forward and backward, in a random
// place (any block), by much more than rounding. k's change moves phi under
// every map (k + 2 (1 + |k|) > 0); w stays valid (non-negative when it must).
void make_stale(RandomCall& c, std::mt19937_64& rng) {
  const int64_t which = pick(rng, 0, 2);
  std::vector<double>& x = which == 0 ? c.backward_k : which == 1 ? c.backward_v : c.backward_w;
  double& e = x[size_t(pick(rng, 0, int64_t(x.size()) - 1))];
  e += which == 0 ? 2 * (1 + std::abs(e)) : 0.5;
  if (c.single_precision) e = double(float(e));
  c.stale = which == 0 ? "stale k" : which == 1 ? "stale v" : "stale w";
}

}  // namespace

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

RandomCall make_random_call(uint64_t seed) {
  std::mt19937_64 rng(seed);
  RandomCall c;
  c.seed = seed;
  Options& o = c.options;
  o.layout = random_layout(rng, int(pick(rng, 1, 3)));
  const int64_t rank = o.layout.rank();
  const int64_t masking = pick(rng, 0, rank == 1 ? 2 : 1);
  o.masking =
      masking == 0 ? Masking::none : (masking == 1 ? Masking::block_causal : Masking::causal);
  o.feature_map = static_cast<FeatureMap>(pick(rng, 0, 2));
  o.normalize = chance(rng, 0.75);
  if (o.normalize && chance(rng, 0.1)) o.eps = 0;  // defined unless a denominator is 0
  if (!o.normalize && chance(rng, 0.3))
    o.scale = std::uniform_real_distribution<double>(0.1, 2)(rng);
  o.mixing =
      o.masking != Masking::none && chance(rng, 0.3) ? MixingForm::toeplitz : MixingForm::dense;
  c.single_precision = chance(rng, 0.5);
  c.backward = chance(rng, 0.5);
  c.keep_state = chance(rng, 0.4);

  const int64_t b = pick(rng, 1, 2), n = o.layout.num_tokens(), h = pick(rng, 1, 3);
  const int64_t dk = pick(rng, 1, 6), dv = pick(rng, 1, 6), m = o.layout.num_blocks();
  const bool per_head = chance(rng, 0.4);
  c.q_shape = c.k_shape = {b, n, h, dk};
  c.v_shape = c.o_shape = {b, n, h, dv};
  c.grad_q_shape = c.q_shape;
  if (o.mixing == MixingForm::toeplitz) {
    const int64_t length = pick(rng, 0, 5);
    c.w_shape = per_head ? std::vector<int64_t>{h, length + 1} : std::vector<int64_t>{length + 1};
  } else {
    c.w_shape = per_head ? std::vector<int64_t>{h, m, m} : std::vector<int64_t>{m, m};
  }
  c.grad_w_shape = c.w_shape;

  // Magnitudes: mostly O(1); sometimes tiny or large; rarely near the dtype's
  // overflow, where the operator must either stay finite or say why not.
  const double huge = c.single_precision ? 1e19 : 1e155;
  const double magnitudes[] = {1, 1, 1, 1, 1, 1e-3, 1e3, huge};
  const double qk_scale = magnitudes[pick(rng, 0, 7)];
  // Identity features with normalisation need positive q and k (signed sums
  // could make a denominator cross zero); the other maps accept any sign.
  const double lo = o.feature_map == FeatureMap::identity && o.normalize ? 0.05 : -1.0;
  const bool single = c.single_precision;
  c.q = values(rng, element_count(c.q_shape), lo, 1, qk_scale, single);
  c.k = values(rng, element_count(c.k_shape), lo, 1, qk_scale, single);
  c.v = values(rng, element_count(c.v_shape), -1, 1, 1, single);
  c.w = values(rng, element_count(c.w_shape), o.normalize ? 0.05 : -1, 1, 1, single);
  c.grad_o = values(rng, element_count(c.v_shape), -1, 1, 1, single);

  if (chance(rng, 0.5)) {
    for (int attempt = 0; attempt < 32 && c.flaw.empty(); ++attempt) {
      const auto flaw = static_cast<CallFlaw>(pick(rng, 1, int64_t(CallFlaw::count) - 1));
      if (apply_flaw(c, flaw, rng)) c.flaw = to_string(flaw);
    }
  }
  c.backward_k = c.k, c.backward_v = c.v, c.backward_w = c.w;
  if (c.flaw.empty() && c.backward && c.keep_state && chance(rng, 0.5)) make_stale(c, rng);
  return c;
}

const char* to_string(CallFlaw flaw) {
  switch (flaw) {
    case CallFlaw::none:
      return "none";
    case CallFlaw::k_head_dim:
      return "k head dim";
    case CallFlaw::k_tokens:
      return "k tokens";
    case CallFlaw::v_batch_tokens_or_heads:
      return "v batch/tokens/heads";
    case CallFlaw::w_blocks:
      return "w size";
    case CallFlaw::w_rank:
      return "w rank";
    case CallFlaw::zero_extent:
      return "zero extent";
    case CallFlaw::layout_tokens:
      return "layout tokens";
    case CallFlaw::negative_w:
      return "negative w";
    case CallFlaw::nan_w:
      return "NaN in w";
    case CallFlaw::o_shape:
      return "o shape";
    case CallFlaw::grad_q_shape:
      return "grad_q shape";
    case CallFlaw::grad_w_shape:
      return "grad_w shape";
    case CallFlaw::causal_2d:
      return "causal on a grid";
    case CallFlaw::scale_when_normalized:
      return "scale with normalize";
    case CallFlaw::bad_eps:
      return "negative or NaN eps";
    case CallFlaw::toeplitz_without_mask:
      return "Toeplitz without masking";
    case CallFlaw::null_k:
      return "null k";
    case CallFlaw::q_rank:
      return "q rank";
    case CallFlaw::count:
      break;
  }
  return "?";
}

bool apply_flaw(RandomCall& c, CallFlaw flaw, std::mt19937_64& rng) {
  Options& o = c.options;
  const int64_t delta = chance(rng, 0.5) ? 1 : -1;
  auto off_by_one = [&](std::vector<int64_t>& shape, size_t axis) {
    if (shape[axis] + delta < 1) return false;
    shape[axis] += delta;
    return true;
  };
  switch (flaw) {
    case CallFlaw::k_head_dim:
      return off_by_one(c.k_shape, 3);
    case CallFlaw::k_tokens:
      return off_by_one(c.k_shape, 1);
    case CallFlaw::v_batch_tokens_or_heads:
      return off_by_one(c.v_shape, size_t(pick(rng, 0, 2)));
    case CallFlaw::w_blocks:
      if (o.mixing == MixingForm::toeplitz) {
        // Any length L is valid Toeplitz input; only a per-head copy count can be wrong.
        if (c.w_shape.size() != 2) return false;
        c.w_shape[0] += 1;
        return true;
      }
      c.w_shape.back() += 1;  // square, but not M x M
      c.w_shape[c.w_shape.size() - 2] += 1;
      return true;
    case CallFlaw::w_rank:
      c.w_shape.insert(c.w_shape.begin(), {1, 1});
      return true;
    case CallFlaw::zero_extent:
      c.q_shape[0] = c.k_shape[0] = c.v_shape[0] = c.o_shape[0] = c.grad_q_shape[0] = 0;
      return true;
    case CallFlaw::layout_tokens:
      o.layout = TokenLayout::sequence(o.layout.num_tokens() + 1, 1);
      return true;
    case CallFlaw::negative_w:
      if (!o.normalize) return false;
      // Entry [.., 0] of the last row is read in every masking mode.
      c.w[c.w.size() - (o.mixing == MixingForm::dense ? size_t(c.w_shape.back()) : 1)] = -0.5;
      return true;
    case CallFlaw::nan_w:
      c.w[0] = std::numeric_limits<double>::quiet_NaN();
      return true;
    case CallFlaw::o_shape:
      return off_by_one(c.o_shape, 3);
    case CallFlaw::grad_q_shape:
      return c.backward && off_by_one(c.grad_q_shape, 3);
    case CallFlaw::grad_w_shape:
      return c.backward && off_by_one(c.grad_w_shape, c.grad_w_shape.size() - 1);
    case CallFlaw::causal_2d:
      if (o.layout.rank() == 1) return false;
      o.masking = Masking::causal;
      return true;
    case CallFlaw::scale_when_normalized:
      if (!o.normalize) return false;
      o.scale = 0.5;
      return true;
    case CallFlaw::bad_eps:
      o.eps = chance(rng, 0.5) ? -1e-3 : std::numeric_limits<double>::quiet_NaN();
      return true;
    case CallFlaw::toeplitz_without_mask:
      if (o.mixing != MixingForm::toeplitz) return false;
      o.masking = Masking::none;
      return true;
    case CallFlaw::null_k:
      c.null_k = true;
      return true;
    case CallFlaw::q_rank:
      c.q_shape.erase(c.q_shape.begin());
      return true;
    case CallFlaw::none:
    case CallFlaw::count:
      break;
  }
  return false;
}

std::vector<NamedResult> reference_results(const RandomCall& c) {
  const Options& opt = c.options;
  std::vector<NamedResult> results = {{"o", std::vector<double>(size_t(element_count(c.v_shape)))}};
  reference::block_forward(opt, {c.q.data(), c.q_shape}, {c.k.data(), c.k_shape},
                           {c.v.data(), c.v_shape}, {c.w.data(), c.w_shape},
                           {results[0].values.data(), c.v_shape});
  if (!c.backward) return results;
  std::vector<double> gq(c.q.size()), gk(c.k.size()), gv(c.v.size()), gw(c.w.size());
  reference::block_backward(opt, {c.q.data(), c.q_shape}, {c.k.data(), c.k_shape},
                            {c.v.data(), c.v_shape}, {c.w.data(), c.w_shape},
                            {c.grad_o.data(), c.v_shape}, {gq.data(), c.q_shape},
                            {gk.data(), c.k_shape}, {gv.data(), c.v_shape}, {gw.data(), c.w_shape});
  results.push_back({"grad_q", std::move(gq)});
  results.push_back({"grad_k", std::move(gk)});
  results.push_back({"grad_v", std::move(gv)});
  results.push_back({"grad_w", std::move(gw)});
  return results;
}

std::string compare_result(const NamedResult& want, const std::vector<double>& got,
                           bool single_precision) {
  if (got.size() != want.values.size()) return want.name + " has the wrong size";
  double scale = 1, err = 0;
  for (double x : got)
    if (!std::isfinite(x)) return "non-finite " + want.name + " returned without an error";
  for (double x : want.values) {
    if (!std::isfinite(x)) return "";  // the double reference itself overflowed: nothing to compare
    scale = std::max(scale, std::abs(x));
  }
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want.values[i]));
  const double tolerance = (single_precision ? 2e-3 : 1e-8) * (want.name == "o" ? 1 : 10);
  if (err / scale > tolerance)
    return want.name + " differs from the reference by " + std::to_string(err / scale) +
           " (relative)";
  return "";
}

std::string RandomCall::describe() const {
  std::string text =
      "seed " + std::to_string(seed) + ": " + options.layout.describe() + ", masking " +
      to_string(options.masking) + ", " + to_string(options.feature_map) +
      (options.normalize ? ", normalized" : ", unnormalized") + ", " + to_string(options.mixing) +
      " mixing, " + (single_precision ? "float32" : "float64") + (backward ? ", backward" : "") +
      (keep_state ? ", forward state" : "") + (stale.empty() ? "" : ", " + stale) + "; q " +
      shape_to_string(q_shape) + " k " + shape_to_string(k_shape) + " v " +
      shape_to_string(v_shape) + " w " + shape_to_string(w_shape);
  return text + (flaw.empty() ? "" : "; flaw: " + flaw);
}

}  // namespace mhla::fuzz
