#pragma once
// Index arithmetic for the canonical [B, N, H, D] layout, shared by the references.
#include <cstdint>
#include <vector>

#include "core/validate.hpp"

namespace mhla::reference {

struct Indexer {
  int64_t tokens, heads;
  // Offset of element (b, t, h, 0) in a [B, N, H, width] tensor.
  int64_t operator()(int64_t b, int64_t t, int64_t h, int64_t width) const {
    return ((b * tokens + t) * heads + h) * width;
  }
};

// w[i, b] for head h, whether w is shared [M, M] or per head [H, M, M].
inline double mixing(const detail::Problem& p, const double* w, int64_t h, int64_t i, int64_t b) {
  const int64_t m = p.blocks;
  return w[((p.per_head_mixing ? h : 0) * m + i) * m + b];
}

// Position of w[i, b] for head h in w's storage (where its gradient goes).
inline int64_t mixing_index(const detail::Problem& p, int64_t h, int64_t i, int64_t b) {
  const int64_t m = p.blocks;
  return ((p.per_head_mixing ? h : 0) * m + i) * m + b;
}

// Whether query token t may read key token s.
inline bool visible(const detail::Problem& p, int64_t t, int64_t s) {
  if (p.causal) return s <= t;
  if (p.block_causal) return p.layout->block_of(s) <= p.layout->block_of(t);
  return true;
}

}  // namespace mhla::reference
