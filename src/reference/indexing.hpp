#pragma once
// Index arithmetic for the canonical [B, N, H, D] layout, shared by the references.
#include <algorithm>
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

// Position of W[i, b] for head h in w's storage (where its gradient goes):
// dense [M, M] or [H, M, M], or Toeplitz [L + 1] or [H, L + 1] with
// W[i, b] = w[min(i - b, L)] (read for b <= i only).
inline int64_t mixing_index(const detail::Problem& p, int64_t h, int64_t i, int64_t b) {
  const int64_t copy = p.per_head_mixing ? h : 0;
  if (p.toeplitz) {
    const int64_t length = p.toeplitz_length;
    return copy * (length + 1) + std::min(i - b, length);
  }
  const int64_t m = p.blocks;
  return (copy * m + i) * m + b;
}

// W[i, b] for head h.
inline double mixing(const detail::Problem& p, const double* w, int64_t h, int64_t i, int64_t b) {
  return w[mixing_index(p, h, i, b)];
}

// Whether query token t may read key token s.
inline bool visible(const detail::Problem& p, int64_t t, int64_t s) {
  if (p.causal) return s <= t;
  if (p.block_causal) return p.layout->block_of(s) <= p.layout->block_of(t);
  return true;
}

}  // namespace mhla::reference
