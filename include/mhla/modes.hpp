#pragma once
// The operator's modes: the feature map and the masking. A header of its own,
// plain C++17, so that device code (src/cuda) can include it.

namespace mhla {

// phi, applied to queries and keys; gradients flow through it.
enum class FeatureMap {
  identity,  // phi(x) = x
  relu,      // phi(x) = max(x, 0)
  elu1,      // phi(x) = elu(x) + 1, strictly positive
};

enum class Masking {
  none,          // every query block reads every key block, weighted by W
  causal,        // 1D only: token t reads tokens s <= t
  block_causal,  // query block i reads blocks b <= i in full (any layout; e.g. video
                 // tiles that span whole frames, numbered by time)
};

}  // namespace mhla
