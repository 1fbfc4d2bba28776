#include "api/decoder_checks.hpp"

#include <algorithm>
#include <limits>

#include "core/validate.hpp"

namespace mhla::detail {
namespace {

void require_positive(const char* fn, const char* name, int64_t value) {
  if (value <= 0) fail(fn, std::string(name) + " must be positive, got " + std::to_string(value));
}

}  // namespace

LinearAttentionOptions decoder_as_linear(const DecoderOptions& options) {
  LinearAttentionOptions o;
  static_cast<ReadoutOptions&>(o) = options;
  o.masking = Masking::causal;
  return o;
}

DecoderMixing check_decoder(const char* fn, const DecoderOptions& options,
                            const std::vector<int64_t>& w_shape, const float* w_values,
                            Device w_device) {
  require_positive(fn, "options.batch", options.batch);
  require_positive(fn, "options.heads", options.heads);
  require_positive(fn, "options.dk", options.dk);
  require_positive(fn, "options.dv", options.dv);
  require_positive(fn, "options.block", options.block);
  // The first product bounds dk and dv far below INT64_MAX, so adding 16
  // cannot overflow; (Dk + 16)(Dv + 16) bounds a padded summary (StateLayout).
  for (int64_t extra : {0, 16})
    checked_product({options.batch, options.heads, options.dk + extra, options.dv + extra},
                    std::string(fn) + ": state size");
  check_device(fn, "w", w_device);
  // The operator's own checks (eps, scale, w) on a one-token causal problem
  // with this decoder's heads; a shape-only check passes any non-null address.
  const int marker = 0;
  const void* w = w_values ? static_cast<const void*>(w_values) : &marker;
  Problem problem = check_linear_options(fn, decoder_as_linear(options),
                                         {1, 1, options.heads, options.dk, options.dv});
  DecoderMixing mixing;
  mixing.scale = problem.scale;
  mixing.toeplitz = options.mixing == MixingForm::toeplitz;
  if (mixing.toeplitz) {
    check_toeplitz_shape(fn, Masking::causal, w_shape, w, problem);
    mixing.length = problem.toeplitz_length;
  } else {
    check_square_mixing_shape(fn, w_shape, w, problem);
    mixing.blocks = problem.blocks;
    checked_product({mixing.blocks, options.block}, std::string(fn) + ": context length");
  }
  mixing.per_head = problem.per_head_mixing;
  if (w_values) check_mixing_values(fn, problem, w_values);
  return mixing;
}

int64_t decoder_context(const DecoderOptions& options, const DecoderMixing& mixing) {
  return mixing.toeplitz ? std::numeric_limits<int64_t>::max() : mixing.blocks * options.block;
}

std::string decoder_context_description(const DecoderOptions& options,
                                        const DecoderMixing& mixing) {
  return std::to_string(decoder_context(options, mixing)) + " tokens (w is " +
         std::to_string(mixing.blocks) + "x" + std::to_string(mixing.blocks) + " for blocks of " +
         std::to_string(options.block) + ")";
}

void check_decoder_sequence(const char* fn, const DecoderOptions& options, int64_t seq) {
  if (seq < 0 || seq >= options.batch)
    fail(fn, "sequence " + std::to_string(seq) + " out of range [0, " +
                 std::to_string(options.batch) + ")");
}

AttentionDims check_decoder_prefill(const char* fn, const DecoderOptions& options,
                                    const DecoderMixing& mixing, int64_t seq, int64_t position,
                                    const void* q, const std::vector<int64_t>& q_shape,
                                    const void* k, const std::vector<int64_t>& k_shape,
                                    const void* v, const std::vector<int64_t>& v_shape) {
  check_decoder_sequence(fn, options, seq);
  if (position != 0)
    fail(fn, "sequence " + std::to_string(seq) + " already holds " + std::to_string(position) +
                 " tokens; prefill needs an empty sequence (reset it, or continue with step)");
  const AttentionDims d = check_qkv(fn, q, q_shape, k, k_shape, v, v_shape);
  check_shape_equals(fn, "q", q_shape, {1, d.tokens, options.heads, options.dk},
                     "(one sequence: [1, L, H, Dk])");
  check_shape_equals(fn, "v", v_shape, {1, d.tokens, options.heads, options.dv},
                     "(one sequence: [1, L, H, Dv])");
  if (d.tokens > decoder_context(options, mixing))
    fail(fn, "prompt of " + std::to_string(d.tokens) + " tokens exceeds the context of " +
                 decoder_context_description(options, mixing));
  return d;
}

void check_decoder_step(const char* fn, const DecoderOptions& options, const DecoderMixing& mixing,
                        const std::vector<int64_t>& positions, const void* q,
                        const std::vector<int64_t>& q_shape, const void* k,
                        const std::vector<int64_t>& k_shape, const void* v,
                        const std::vector<int64_t>& v_shape) {
  check_qkv(fn, q, q_shape, k, k_shape, v, v_shape);
  check_shape_equals(fn, "q", q_shape, {options.batch, 1, options.heads, options.dk},
                     "(one token per sequence)");
  check_shape_equals(fn, "v", v_shape, {options.batch, 1, options.heads, options.dv},
                     "(one token per sequence)");
  for (size_t b = 0; b < positions.size(); ++b)
    if (positions[b] >= decoder_context(options, mixing))
      fail(fn, "sequence " + std::to_string(b) + " is full: its context holds " +
                   decoder_context_description(options, mixing));
}

}  // namespace mhla::detail
