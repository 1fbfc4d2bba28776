#pragma once
// Streaming (token-by-token) causal MHLA decoding.
//
// Per sequence and head the state holds the summaries [S_b | z_b] of the
// finished blocks (Toeplitz mixing: only the last L - 1 of them, plus the sum of
// all older ones, so the state stays bounded), the mixed prefix sum_{b<i} W[i,b] [S_b | z_b] of the
// current block i (computed once, when block i begins: O(i Dk Dv)), and the running in-block sums
// (updated per token: O(Dk Dv)). Outputs equal the chunkwise causal forward on the whole sequence,
// in both normalized and unnormalized modes (the normalizer's key sums are part of the state).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mhla/line_aligned.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {
namespace detail {
// What a decoder's options and w say about its mixing: its checks
// (src/api/decoder_checks.hpp) find it, and the decoder keeps it.
struct DecoderMixing {
  double scale = 0;  // the unnormalized read-out's
  bool toeplitz = false;
  bool per_head = false;
  int64_t blocks = 0;  // dense: M
  int64_t length = 0;  // Toeplitz: L
};
}  // namespace detail

// The decoder is causal; its feature map and normalisation are those of the
// operator (ReadoutOptions), with the same defaults.
struct DecoderOptions : ReadoutOptions {
  int64_t batch = 1;  // independent sequences, each at its own position
  int64_t heads = 1, dk = 1, dv = 1;
  int64_t block = 64;  // C: tokens per block
  MixingForm mixing = MixingForm::dense;
  // Rebuild the mixed prefix at every token instead of once per block, as a
  // naive recurrent implementation does. Same outputs; for benchmarks only.
  bool recompute_mix_every_token = false;
};

class Decoder {
 public:
  // Dense mixing: w [M, M] shared or [H, M, M] per head; only b <= i is read. It
  // bounds the context to M * block tokens per sequence.
  // Toeplitz mixing: w [L + 1] or [H, L + 1], W[i, b] = w[min(i - b, L)]; the
  // context is unbounded and the state holds at most L + 2 summaries per head.
  Decoder(const DecoderOptions& options, TensorView<const float> w);

  // Feeds a prompt to sequence `seq`, which must be empty: q, k [1, L, H, Dk],
  // v [1, L, H, Dv]; writes o [1, L, H, Dv]. Runs the chunkwise kernels.
  void prefill(int64_t seq, TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> o);

  // One token for every sequence: q, k [B, 1, H, Dk], v [B, 1, H, Dv] -> o [B, 1, H, Dv].
  void step(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
            TensorView<float> o);

  int64_t position(int64_t seq) const;  // tokens seen by sequence seq
  int64_t max_tokens() const;           // context per sequence (Toeplitz: no limit)
  void reset(int64_t seq);              // empties sequence seq
  int64_t state_bytes() const;          // bytes held by all sequences' states
  // Bytes of one block summary [S | z] in the state: Dk rows of Dv rounded up
  // to 16 floats, then Dk rounded up to 16 key sums (aligned rows for the step).
  int64_t summary_bytes() const { return summary_floats_ * int64_t(sizeof(float)); }
  const DecoderOptions& options() const { return options_; }

  // A versioned, CRC-32-checked binary snapshot of the whole decoder: options,
  // w and every sequence's position and state (format: docs/decoder-state.md).
  std::vector<uint8_t> serialize() const;
  // Writes serialize() to a temporary file, then renames it over `path`.
  void save(const std::string& path) const;
  // Rebuilds a decoder from a snapshot. A truncated, corrupted or unknown-version
  // input, or an inconsistent one, is an mhla::Error naming `source` and the
  // problem. With `expect`, the snapshot's batch, heads, dk, dv, block, feature
  // map, normalization and mixing form must equal expect's.
  static Decoder deserialize(std::span<const uint8_t> bytes,
                             const std::optional<DecoderOptions>& expect = std::nullopt,
                             const std::string& source = "decoder state");
  static Decoder load(const std::string& path,
                      const std::optional<DecoderOptions>& expect = std::nullopt);

 private:
  // 64-byte aligned floats: the step kernel reads whole cache lines of a state row.
  using Floats = detail::LineAlignedVector<float>;
  // Every summary [S_b | z_b] below takes summary_floats_ floats, in the
  // layout of the backend's decoding step (src/backend/backend.hpp,
  // DecodeState), not the operator's [Dk, Dv + 1].
  struct HeadState {
    // The finished blocks kept one by one, oldest at slot `oldest`. Toeplitz:
    // a ring of at most max(L, 1) - 1 slots; the block that leaves the window
    // is added to `far` and its slot takes the new one, so nothing moves.
    Floats finished;
    int64_t oldest = 0;
    Floats far;      // Toeplitz: sum of blocks at distance >= max(L, 1)
    Floats prefix;   // mixed summaries of earlier blocks
    Floats running;  // sums over the current block so far
  };
  // The j-th oldest block a state keeps one by one, and how many it keeps.
  const float* kept_summary(const HeadState& s, int64_t j) const;
  int64_t kept_count(const HeadState& s) const;
  const float* head_w(int64_t h) const;
  float diagonal(int64_t h, int64_t block) const;  // W[block, block]
  // s.prefix = sum_{b < block} W[block, b] [S_b | z_b] over the finished blocks.
  void mix_prefix(HeadState& s, int64_t h, int64_t block) const;
  // Moves a finished block's summary into the state (Toeplitz: evicting into
  // s.far the block that leaves the window of individually weighted ones).
  void push_finished(HeadState& s, const float* summary) const;
  // Finished blocks the state of a sequence at `position` keeps one by one.
  int64_t kept_blocks(int64_t position) const;

  DecoderOptions options_;
  detail::DecoderMixing mixing_;
  int64_t window_ = 0;      // Toeplitz: finished blocks kept one by one, max(L, 1) - 1
  std::vector<float> w_;    // copy of w
  int64_t summary_floats_;  // one summary in the decoding step's layout
  std::vector<int64_t> positions_;
  std::vector<HeadState> states_;  // [B, H]
  std::vector<float> features_;    // step's phi(k_t), phi(q_t) per (sequence, head): [B, H, 2, Dk]
};

}  // namespace mhla
