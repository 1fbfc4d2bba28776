#pragma once
// Random operator calls for the differential front-end fuzzers: a consistent
// call (random layout, masking, feature map, normalisation, mixing form,
// shapes, dtype and magnitudes), then, for about half of them, one flaw that
// every front end must reject with a named error. The same seed always gives
// the same call, so a failure is reproduced from the seed it prints.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mhla/mhla.hpp"

namespace mhla::fuzz {

struct RandomCall {
  uint64_t seed = 0;
  Options options;
  bool single_precision = false;
  bool backward = false;
  bool keep_state = false;  // forward fills a ForwardState, backward reads it
  // Inputs in double (already rounded to float when single_precision).
  std::vector<double> q, k, v, w, grad_o;
  std::vector<int64_t> q_shape, k_shape, v_shape, w_shape;
  // What the caller hands in for the outputs (flaws may change these).
  std::vector<int64_t> o_shape, grad_q_shape, grad_w_shape;
  bool null_k = false;
  // Empty for a consistent call; otherwise what was broken, e.g. "k head dim".
  std::string flaw;
  // Empty, or which input changed between forward and backward while the
  // state was kept ("stale k", "stale v", "stale w"): backward is handed
  // backward_k, backward_v and backward_w, in buffers of their own (otherwise
  // forward's k, v and w). It must refuse the state by name, as its record of
  // forward's call does not match.
  std::string stale;
  std::vector<double> backward_k, backward_v, backward_w;

  std::string describe() const;  // one line: seed, mode, shapes, flaw
};

RandomCall make_random_call(uint64_t seed);

// The flaws a C++ caller can make (pointer and buffer-shape flaws included);
// the command-line fuzzer draws from its own, file-level list.
enum class CallFlaw {
  none,
  k_head_dim,
  k_tokens,
  v_batch_tokens_or_heads,
  w_blocks,
  w_rank,
  zero_extent,
  layout_tokens,
  negative_w,
  nan_w,
  o_shape,
  grad_q_shape,
  grad_w_shape,
  causal_2d,
  scale_when_normalized,
  bad_eps,
  toeplitz_without_mask,
  null_k,
  q_rank,
  count
};
const char* to_string(CallFlaw flaw);
// Applies `flaw` to a consistent call; returns false if it does not apply to
// this call's mode (the caller then draws another).
bool apply_flaw(RandomCall& call, CallFlaw flaw, std::mt19937_64& rng);

int64_t element_count(const std::vector<int64_t>& shape);

// The double-precision block reference of a consistent call, on its exact
// input values: o, then (for backward calls) grad_q, grad_k, grad_v, grad_w.
struct NamedResult {
  std::string name;
  std::vector<double> values;
};
std::vector<NamedResult> reference_results(const RandomCall& call);

// "" if `got` is finite and within `tolerance` of `want` relative to
// max(max |want|, 1) (gradients get 10x: they sum more terms), else what is
// wrong. A reference that itself overflowed is not compared.
std::string compare_result(const NamedResult& want, const std::vector<double>& got,
                           bool single_precision);

}  // namespace mhla::fuzz
