#pragma once
// Locality-biased initialisation of the M x M mixing matrix: query block i reads
// mostly from blocks near it on the block grid.
#include <string>
#include <vector>

#include "mhla/layout.hpp"

namespace mhla {

enum class MixingTransform {
  linear,    // 1 - d/dmax (the paper's default)
  cosine,    // cos(d/dmax * pi/4)
  exp,       // exp(-d/sigma)
  gaussian,  // exp(-d^2 / (2 (dmax/3)^2))
  local,     // [d <= threshold]
  uniform,   // 1 everywhere (MHLA then equals linear attention)
};

struct MixingInit {
  MixingTransform transform = MixingTransform::linear;
  double sigma = 1.0;      // exp only, in block units
  double threshold = 1.5;  // local only, in block units
  bool causal = false;     // keep b <= i only (block order), then renormalise each row
};

// Distance d is measured between block centres (block coordinates + 0.5) on the
// block grid of `layout`; dmax is the largest such distance. Rows sum to 1.
// Returns row-major [M, M], M = layout.num_blocks().
std::vector<float> init_mixing(const TokenLayout& layout, const MixingInit& init = {});

MixingTransform parse_mixing_transform(const std::string& name);
const char* to_string(MixingTransform transform);

}  // namespace mhla
