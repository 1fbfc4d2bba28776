#include "mhla/decoder.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "api/decoder_checks.hpp"
#include "backend/backend.hpp"
#include "core/allocation.hpp"
#include "core/feature_map.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"
#include "core/validated_call.hpp"
#include "cpu/simd/decode_token.hpp"

namespace mhla {
namespace {

constexpr const char* kConstructor = "mhla::Decoder";

// q, k and v are host memory (the decoder's state is): the shape checks
// (decoder_checks.hpp) take no devices.
void check_token_devices(const char* fn, const TensorView<const float>& q,
                         const TensorView<const float>& k, const TensorView<const float>& v) {
  for (const auto& [name, device] : {std::pair{"q", q.device}, {"k", k.device}, {"v", v.device}})
    detail::check_device(fn, name, device);
}

}  // namespace

Decoder::Decoder(const DecoderOptions& options, TensorView<const float> w)
    : options_(options),
      mixing_(detail::check_decoder(kConstructor, options, w.shape, w.data, w.device)),
      window_(std::max<int64_t>(mixing_.length, 1) - 1) {
  const char* fn = kConstructor;
  summary_floats_ = cpu::simd::StateLayout(options.dk, options.dv).floats;
  const size_t summary = size_t(summary_floats_);
  const double state_bytes =
      double(options.batch) * double(options.heads) *
      (sizeof(HeadState) + double(summary) * (mixing_.toeplitz ? 3 : 2) * sizeof(float) +
       2.0 * double(options.dk) * sizeof(float));
  detail::allocating(fn,
                     "the decoding state of " + std::to_string(options.batch) + " x " +
                         std::to_string(options.heads) + " heads of summaries of " +
                         std::to_string(summary_floats_) + " floats",
                     state_bytes, [&] {
                       w_.assign(w.data, w.data + detail::checked_product(w.shape, "w"));
                       positions_.assign(options.batch, 0);
                       states_.resize(size_t(options.batch * options.heads));
                       for (HeadState& s : states_) {
                         s.prefix.assign(summary, 0.0f);
                         s.running.assign(summary, 0.0f);
                         if (mixing_.toeplitz) s.far.assign(summary, 0.0f);
                       }
                       features_.resize(size_t(options.batch * options.heads * 2 * options.dk));
                     });
}

int64_t Decoder::max_tokens() const { return detail::decoder_context(options_, mixing_); }

const float* Decoder::head_w(int64_t h) const {
  if (!mixing_.per_head) return w_.data();
  return w_.data() + h * (mixing_.toeplitz ? mixing_.length + 1 : mixing_.blocks * mixing_.blocks);
}

float Decoder::diagonal(int64_t h, int64_t block) const {
  return mixing_.toeplitz ? head_w(h)[0] : head_w(h)[block * mixing_.blocks + block];
}

const float* Decoder::kept_summary(const HeadState& s, int64_t j) const {
  return s.finished.data() + (s.oldest + j) % kept_count(s) * summary_floats_;
}

int64_t Decoder::kept_count(const HeadState& s) const {
  return int64_t(s.finished.size()) / summary_floats_;
}

void Decoder::mix_prefix(HeadState& s, int64_t h, int64_t block) const {
  const int64_t x = summary_floats_;
  const int64_t kept = kept_count(s);
  if (mixing_.toeplitz) {
    // prefix = w[L] far + sum_{d = 1}^{kept} w[d] S_{block - d}; far holds the
    // blocks at distance >= max(L, 1).
    const float* w = head_w(h);
    for (int64_t c = 0; c < x; ++c) s.prefix[c] = w[mixing_.length] * s.far[c];
    for (int64_t d = 1; d <= kept; ++d)
      cblas_saxpy(blasint(x), w[d], kept_summary(s, kept - d), 1, s.prefix.data(), 1);
    return;
  }
  // prefix = sum_{b < block} W[block, b] [S_b | z_b]: one GEMV over the finished blocks.
  if (block == 0) {
    std::fill(s.prefix.begin(), s.prefix.end(), 0.0f);
    return;
  }
  // Without Toeplitz mixing nothing leaves the state: the blocks lie in order.
  cblas_sgemv(CblasRowMajor, CblasTrans, blasint(block), blasint(x), 1.0f, s.finished.data(),
              blasint(x), head_w(h) + block * mixing_.blocks, 1, 0.0f, s.prefix.data(), 1);
}

int64_t Decoder::kept_blocks(int64_t position) const {
  const int64_t finished = position > 0 ? (position - 1) / options_.block : 0;
  return mixing_.toeplitz ? std::min(finished, window_) : finished;
}

void Decoder::push_finished(HeadState& s, const float* summary) const {
  const int64_t x = summary_floats_;
  if (!mixing_.toeplitz || kept_count(s) < window_) {
    s.finished.insert(s.finished.end(), summary, summary + x);
    return;
  }
  // The window is full: its oldest block now sits at distance max(L, 1) and
  // joins the tail sum, and the new block takes its slot.
  if (window_ == 0) {
    cblas_saxpy(blasint(x), 1.0f, summary, 1, s.far.data(), 1);
    return;
  }
  float* slot = s.finished.data() + s.oldest * x;
  cblas_saxpy(blasint(x), 1.0f, slot, 1, s.far.data(), 1);
  std::copy(summary, summary + x, slot);
  s.oldest = (s.oldest + 1) % window_;
}

int64_t Decoder::position(int64_t seq) const {
  detail::check_decoder_sequence("mhla::Decoder::position", options_, seq);
  return positions_[seq];
}

void Decoder::reset(int64_t seq) {
  detail::check_decoder_sequence("mhla::Decoder::reset", options_, seq);
  positions_[seq] = 0;
  for (int64_t h = 0; h < options_.heads; ++h) {
    HeadState& s = states_[seq * options_.heads + h];
    s.finished.clear();
    s.oldest = 0;
    std::fill(s.far.begin(), s.far.end(), 0.0f);
    std::fill(s.prefix.begin(), s.prefix.end(), 0.0f);
    std::fill(s.running.begin(), s.running.end(), 0.0f);
  }
}

int64_t Decoder::state_bytes() const {
  int64_t floats = 0;
  for (const HeadState& s : states_)
    floats += int64_t(s.finished.size() + s.far.size() + s.prefix.size() + s.running.size());
  return floats * int64_t(sizeof(float)) + int64_t(positions_.size() * sizeof(int64_t));
}

void Decoder::prefill(int64_t seq, TensorView<const float> q, TensorView<const float> k,
                      TensorView<const float> v, TensorView<float> o) {
  const char* fn = "mhla::Decoder::prefill";
  detail::check_decoder_sequence(fn, options_, seq);
  check_token_devices(fn, q, k, v);
  const detail::AttentionDims d =
      detail::check_decoder_prefill(fn, options_, mixing_, seq, positions_[seq], q.data, q.shape,
                                    k.data, k.shape, v.data, v.shape);
  detail::check_output(fn, "o", o, {1, d.tokens, options_.heads, options_.dv});

  // The chunkwise forward on the prompt, straight through the backend: the
  // options and w were validated when the decoder was built, and a dense w is
  // read in place (its top-left corner, through its row stride).
  TokenLayout layout = TokenLayout::sequence(d.tokens, options_.block);
  detail::Problem problem =
      detail::check_linear_options(fn, detail::decoder_as_linear(options_), d);
  problem.blocks = problem.mixing_blocks = layout.num_blocks();
  problem.w_stride = mixing_.blocks;
  problem.per_head_mixing = mixing_.per_head;
  problem.toeplitz = mixing_.toeplitz;
  problem.toeplitz_length = mixing_.length;
  const detail::ValidatedCall call(std::move(problem), std::move(layout));
  const detail::Problem& p = call.problem();
  const int64_t m = p.blocks, heads = options_.heads;
  const size_t x = size_t(options_.dk * (options_.dv + 1));
  std::vector<float> saved = detail::allocating(
      fn, "the prompt's block summaries", double(heads * m) * double(x) * sizeof(float),
      [&] { return std::vector<float>(size_t(heads * m) * x); });
  if (!backend::backend_for(fn, "q", q.device)
           .attention(p, w_.data())
           ->forward(q.data, k.data, v.data, o.data, saved.data(), nullptr))
    detail::report_non_finite_output(fn, p, q, k, v, o);

  // Blocks before the last are finished; the last one is the running block.
  const cpu::simd::StateLayout stored_layout(options_.dk, options_.dv);
  Floats stored(static_cast<size_t>(summary_floats_));
  for (int64_t h = 0; h < heads; ++h) {
    HeadState& s = states_[seq * heads + h];
    const float* blocks = saved.data() + h * m * x;
    for (int64_t b = 0; b + 1 < m; ++b) {
      stored_layout.store(blocks + b * x, stored.data());
      push_finished(s, stored.data());
    }
    stored_layout.store(blocks + (m - 1) * x, s.running.data());
    mix_prefix(s, h, m - 1);
  }
  positions_[seq] = d.tokens;
}

void Decoder::step(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                   TensorView<float> o) {
  const char* fn = "mhla::Decoder::step";
  const int64_t batch = options_.batch, heads = options_.heads, dk = options_.dk, dv = options_.dv;
  check_token_devices(fn, q, k, v);
  detail::check_decoder_step(fn, options_, mixing_, positions_, q.data, q.shape, k.data, k.shape,
                             v.data, v.shape);
  detail::check_output(fn, "o", o, {batch, 1, heads, dv});

  const float eps = float(options_.eps), scale = float(mixing_.scale);
  const cpu::simd::StateLayout stored_layout(dk, dv);
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int64_t task = 0; task < batch * heads; ++task) {
    const int64_t b = task / heads, h = task % heads, pos = positions_[b];
    const int64_t block = pos / options_.block;
    HeadState& s = states_[task];
    if (pos % options_.block == 0) {
      // Block `block` begins: the previous one is finished, and the mix of all
      // finished blocks is computed once for the whole block.
      if (pos > 0) push_finished(s, s.running.data());
      std::fill(s.running.begin(), s.running.end(), 0.0f);
      mix_prefix(s, h, block);
    } else if (options_.recompute_mix_every_token) {
      mix_prefix(s, h, block);
    }
    const float* qt = q.data + task * dk;
    const float* kt = k.data + task * dk;
    float* kap = features_.data() + task * 2 * dk;
    float* u = kap + dk;
    detail::dispatch_feature(options_.feature_map, [&]<FeatureMap Phi>() {
#pragma omp simd
      for (int64_t a = 0; a < dk; ++a) {
        kap[a] = detail::apply_feature<Phi>(kt[a]);
        u[a] = detail::apply_feature<Phi>(qt[a]);
      }
    });
    // running += phi(k_t) [v_t | 1]^T;  y = phi(q_t)^T (prefix + W[i,i] running)
    float* out = o.data + task * dv;
    const float den =
        cpu::simd::decode_token(stored_layout, kap, v.data + task * dv, u, diagonal(h, block),
                                s.prefix.data(), s.running.data(), out);
    const float factor = options_.normalize ? 1.0f / (den + eps) : scale;
    for (int64_t e = 0; e < dv; ++e) out[e] *= factor;
    finite = finite && std::isfinite(den) && detail::first_non_finite(out, dv) < 0;
  }
  for (int64_t& p : positions_) ++p;
  if (finite) return;
  detail::Problem mode;
  mode.normalize = options_.normalize;
  mode.eps = options_.eps;
  mode.phi = options_.feature_map;
  // The token is already part of every sequence's state; the message says so
  // because that state now holds the overflow too.
  try {
    detail::report_non_finite_output(fn, mode, q, k, v, o);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the token was added to the state; reset the sequence)");
  }
}

}  // namespace mhla
