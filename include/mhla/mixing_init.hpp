#pragma once
// Locality-biased initialisation of the M x M mixing matrix: query block i reads
// mostly from blocks near it on the block grid.
#include <string>
#include <vector>

#include "mhla/layout.hpp"
#include "mhla/tensor.hpp"

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

// The largest M a dense mixing matrix is made for: 8192^2 floats are 256 MiB,
// and with the paper's M^2 <= N that serves sequences of 67M tokens. Larger
// requests are an mhla::Error that says so (Toeplitz mixing has no such limit).
inline constexpr int64_t kMaxDenseMixingBlocks = 8192;

// Distance d is measured between block centres (block coordinates + 0.5) on the
// block grid of `layout`; dmax is the largest such distance. Rows sum to 1.
// Returns row-major [M, M], M = layout.num_blocks().
std::vector<float> init_mixing(const TokenLayout& layout, const MixingInit& init = {});

// Toeplitz mixing (MixingForm::toeplitz) of L + 1 entries: w[d] = the transform
// of distance d in blocks with dmax = L, so w[0] = 1 and the tail w[L] covers
// every distance >= L (0 for the linear transform: no reading beyond L).
// init.causal is ignored (Toeplitz mixing only reads b <= i).
std::vector<float> init_toeplitz_mixing(int64_t length, const MixingInit& init = {});

// The dense matrix a Toeplitz w stands for: w [L + 1] -> [M, M], or
// [H, L + 1] -> [H, M, M]; W[i, b] = w[min(i - b, L)] for b <= i, 0 above.
std::vector<float> toeplitz_to_dense(TensorView<const float> w, int64_t blocks);

MixingTransform parse_mixing_transform(const std::string& name);
const char* to_string(MixingTransform transform);

}  // namespace mhla
