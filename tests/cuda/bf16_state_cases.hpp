#pragma once
// The shapes the bfloat16-state CUDA kernels are checked on, in its tiling
// emulation and on a GPU: Dk and Dv multiples of 8 up to 128, ragged 1D, 2D
// and 3D blocks, blocks of more than one staged chunk of keys (32) and of
// queries (64), more than one mix tile of rows (64 blocks) and of columns
// (128 entries), both widths of CTA (Dv up to 64, up to 128), every mode.
#include "test_support.hpp"

namespace mhla::test {

// The bfloat16-state backward's tolerances in units of each tensor's scale
// (relative_error), in its emulation and on a GPU. Largest errors on the
// catalogue (emulated): grad q, k, v under 1e-2; grad w 0.047, in block-causal
// cases, where the own block's weight barely moves o under normalisation
// (the first row's not at all) and dW's products, each operand rounded to
// bfloat16 once (S, grad S~; W in the mixes, S~, dY upstream), cancel. With
// those five roundings taken out of the emulation every case met float64 at
// 1e-2 (the worst case's grad w to five digits): the tiling is exact, the
// error is bfloat16's. The CPU's bfloat16 path shows the same cancellation
// (grad w 0.054, tests/mhla/test_bfloat16.cpp).
constexpr double kStateGradientTolerance = 1e-2;
constexpr double kStateWeightGradientTolerance = 0.06;
// float16 tokens are rounded to bfloat16 as they are staged, so against
// float64 on the float16 inputs the same cancelling sums move further: grad w
// 0.121 at worst (one block-causal case with the identity map), the rest of
// the catalogue as for bfloat16; against float64 on the inputs as staged,
// every case meets the bfloat16 tolerances.
constexpr double kFloat16StateWeightGradientTolerance = 0.15;

inline std::vector<Case> bf16_state_cases() {
  return with_all_modes({
      {"1d-ragged-narrow", 2, 3, 8, 16, TokenLayout::sequence(37, 8)},
      {"1d-long-blocks", 1, 2, 72, 24, TokenLayout::sequence(300, 100)},
      {"1d-many-blocks", 1, 1, 16, 8, TokenLayout::sequence(280, 4)},
      {"2d-ragged-wide", 1, 2, 40, 120, TokenLayout::grid2d(11, 9, 4, 3)},
      {"3d-ragged-full", 1, 1, 128, 128, TokenLayout::grid3d(3, 9, 10, 2, 4, 6)},
      // The video shape's tiles (150-token blocks: read-out CTAs of 64, 64
      // and 22 tokens) at the wider CTA, and a hundred blocks (two mix tiles
      // of rows, one ragged) at Dv = 128.
      {"3d-video-tiles-wide", 1, 1, 64, 128, TokenLayout::grid3d(1, 30, 20, 1, 15, 10)},
      {"1d-hundred-blocks-wide", 1, 1, 64, 128, TokenLayout::sequence(800, 8)},
  });
}

// float16 tokens on the same kernels: a ragged 1D shape (every mode, causal
// included) and a ragged 2D one on the wider CTA, enough to show the
// staging's rounding and the float16 writes; their tiling is the bfloat16
// catalogue's.
inline std::vector<Case> float16_state_cases() {
  return with_all_modes({
      {"1d-ragged-narrow", 2, 3, 8, 16, TokenLayout::sequence(37, 8)},
      {"2d-ragged-wide", 1, 2, 40, 120, TokenLayout::grid2d(11, 9, 4, 3)},
  });
}

}  // namespace mhla::test
