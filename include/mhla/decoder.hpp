#pragma once
// Streaming (token-by-token) causal MHLA decoding.
//
// Per sequence and head the state holds the summaries [S_b | z_b] of the
// finished blocks, the mixed prefix sum_{b<i} W[i,b] [S_b | z_b] of the current
// block i (computed once, when block i begins: O(i Dk Dv)), and the running
// in-block sums (updated per token: O(Dk Dv)). Outputs equal the chunkwise
// causal forward on the whole sequence, in both normalized and unnormalized
// modes (the normalizer's key sums are part of the state).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

struct DecoderOptions {
  int64_t batch = 1;  // independent sequences, each at its own position
  int64_t heads = 1, dk = 1, dv = 1;
  int64_t block = 64;  // C: tokens per block
  FeatureMap feature_map = FeatureMap::elu1;
  bool normalize = true;
  double eps = 1e-6;
  std::optional<double> scale;  // unnormalized mode only; default Dk^-1/2
  // Rebuild the mixed prefix at every token instead of once per block, as a
  // naive recurrent implementation does. Same outputs; for benchmarks only.
  bool recompute_mix_every_token = false;
};

class Decoder {
 public:
  // w: [M, M] shared or [H, M, M] per head; only b <= i is read. It bounds the
  // context to M * block tokens per sequence.
  Decoder(const DecoderOptions& options, TensorView<const float> w);

  // Feeds a prompt to sequence `seq`, which must be empty: q, k [1, L, H, Dk],
  // v [1, L, H, Dv]; writes o [1, L, H, Dv]. Runs the chunkwise kernels.
  void prefill(int64_t seq, TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> o);

  // One token for every sequence: q, k [B, 1, H, Dk], v [B, 1, H, Dv] -> o [B, 1, H, Dv].
  void step(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
            TensorView<float> o);

  int64_t position(int64_t seq) const;  // tokens seen by sequence seq
  int64_t max_tokens() const { return blocks_ * options_.block; }
  void reset(int64_t seq);              // empties sequence seq
  int64_t state_bytes() const;          // bytes held by all sequences' states

 private:
  struct HeadState {
    std::vector<float> finished;  // [blocks finished, Dk, Dv + 1]
    std::vector<float> prefix;    // [Dk, Dv + 1] mixed summaries of earlier blocks
    std::vector<float> running;   // [Dk, Dv + 1] sums over the current block so far
  };
  const float* head_w(int64_t h) const;
  // s.prefix = sum_{b < block} W[block, b] [S_b | z_b] over s.finished.
  void mix_prefix(HeadState& s, int64_t h, int64_t block) const;
  void check_seq(const char* fn, int64_t seq) const;
  std::string context_description() const;  // "4096 tokens (w is 64x64 for blocks of 64)"
  LinearAttentionOptions options_as_linear() const;

  DecoderOptions options_;
  double scale_;
  int64_t blocks_;             // M
  std::vector<float> w_;       // copy of w
  bool per_head_;
  std::vector<int64_t> positions_;
  std::vector<HeadState> states_;  // [B, H]
};

}  // namespace mhla
