#pragma once
// The explicit attention matrices of softmax, linear attention and MHLA for one
// (batch, head) of q, k, with their numerical rank and mean row entropy: the
// paper's diagnosis of global context collapse. O(N^2) memory: small N only.
#include <string>
#include <vector>

#include "mhla/mhla.hpp"

namespace mhla::tools {

struct AttentionMap {
  std::string method;          // "softmax", "linear", "mhla"
  std::string description;     // e.g. "MHLA, elu1, 16 blocks"
  std::vector<double> matrix;  // row-major [N, N]
  int64_t rank = 0;
  double entropy = 0;  // mean row entropy, nats
};

// q, k: [B, N, H, D] in double. Linear attention uses MHLA's feature map and
// normalization on a single block (causal if MHLA is); softmax is causal if MHLA is.
std::vector<AttentionMap> attention_maps(const Options& mhla, TensorView<const double> q,
                                         TensorView<const double> k, TensorView<const double> w,
                                         int64_t batch, int64_t head);

}  // namespace mhla::tools
