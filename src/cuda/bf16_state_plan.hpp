#pragma once
// The tiling of the bfloat16-state kernels (bf16_state_forward.cuh,
// bf16_state_backward.cuh), written once for the device and the host: what a CTA covers, which 16 bytes of
// which staged row each thread copies and from where, what is zero-filled,
// and where each lane's part of a 16 x 16 result fragment is written. The
// kernels take every index from these functions, and the tiling emulation
// (tests/cuda/test_bf16_state_tiling.cpp) runs the same functions on the CPU
// against the float64 operator, so CI checks the tiling without a GPU.
//
// The design (docs/cuda.md#the-byte-budget): the state in bfloat16 rows
// (S_b and S~_b as [Dk, Dv]; z_b and z~_b in float, [Dk]), every product one
// bfloat16 tensor-core step summed in float, every token tensor and state row
// staged by 16-byte asynchronous copies, and each CTA covering all of Dk x Dv
// so that each block's tokens are read once.
#include <cstdint>

#include "cuda/device_helpers.cuh"
#include "cuda/kernel_problem.hpp"

namespace mhla::cuda::state {

constexpr int kSegment = 8;  // bfloat16 entries in one 16-byte copy
constexpr int kFrag = 16;    // the tensor-core fragment's side
constexpr int kMaxDim = 128;  // Dk and Dv up to this, multiples of kSegment
constexpr int kPad = 8;       // staged rows padded by 16 bytes: aligned fragments, spread banks
constexpr int kOutPad = 4;    // a float fragment's staging row, 16-byte aligned
constexpr int kStages = 2;    // copies of the next chunk run under the products of this one
constexpr int64_t kMaxGridYZ = 65535;

// The summaries: one CTA per (block, slice), warp w holding rows
// [16 w, 16 w + 16) of S_b over all of its columns; kKeyChunk tokens staged a step.
constexpr int kKeyChunk = 32;
// The read-out: one CTA per (kReadTokens tokens of a block, slice), warp w
// its tokens [16 w, 16 w + 16) over all of Dv; Dk staged kInnerChunk at a time.
// With token-level causal masking the CTA then adds its own block's keys up
// to its last token, kKeyChunk keys a step (their scores a warp's 16 x
// kKeyChunk tile, masked and scaled by W[i, i], then against V).
constexpr int kReadTokens = 64, kReadWarps = kReadTokens / kFrag, kInnerChunk = 32;
// The mix: kMixRows rows of W against kMixColumns entries of one slice's
// [M, Dk Dv] summaries a CTA, warp w its rows [16 w, 16 w + 16); kInnerChunk
// blocks staged a step.
constexpr int kMixRows = 64, kMixColumns = 128, kMixWarps = kMixRows / kFrag;

MHLA_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Fragments a CTA row spans to cover `columns` (Dv): two instantiations of
// each kernel, 64 and 128 columns wide.
MHLA_HD constexpr int column_fragments(int64_t columns) { return columns <= 64 ? 4 : 8; }

// Warps of a summaries CTA: one per 16 rows of Dk.
MHLA_HD constexpr int summaries_warps(int64_t dk) { return int(ceil_div(dk, kFrag)); }

// Whether the kernels take the problem (the caller checks 16-byte alignment
// of the tensors): a whole sequence, Dk and Dv multiples of 8 up to 128, and
// the grid limits.
MHLA_HD inline bool fits(const KernelProblem& p) {
  const int64_t slices = p.batch * p.heads;
  return p.dk > 0 && p.dv > 0 && p.dk % kSegment == 0 && p.dv % kSegment == 0 &&
         p.dk <= kMaxDim && p.dv <= kMaxDim && p.first_block == 0 &&
         p.mixing_blocks == p.blocks && p.blocks > 0 && slices <= kMaxGridYZ &&
         p.heads <= INT32_MAX && ceil_div(p.dk * p.dv, kMixColumns) <= kMaxGridYZ &&
         p.blocks * ceil_div(p.largest_block, kReadTokens) <= INT32_MAX;
}

// Segment g of a staged tile with kSegments segments a row: its row and its
// first column. Thread t copies segments t, t + threads, ...
struct Segment {
  int row, column;
};
template <int kSegments>
MHLA_HD constexpr Segment segment_of(int g) {
  return {g / kSegments, g % kSegments * kSegment};
}

// Where lane l of a warp writes its 8 consecutive results of a 16 x 16 fragment.
MHLA_HD constexpr Segment lane_segment(int lane) { return {lane / 2, lane % 2 * kSegment}; }

// Slice bh as its batch entry and head, in 32-bit arithmetic (bh < 65,536).
struct Slice {
  int64_t batch_entry, head;
};
MHLA_HD inline Slice slice_of(const KernelProblem& p, unsigned bh) {
  const unsigned heads = unsigned(p.heads);
  return {int64_t(bh / heads), int64_t(bh % heads)};
}

// Token j of block `block` as a row of the token tensors of slice s, or -1
// past the block's end.
MHLA_HD inline int64_t block_token_row(const KernelProblem& p, const Slice& s, int64_t block,
                                       int64_t j) {
  const int64_t first = p.block_start[block];
  if (j >= p.block_start[block + 1] - first) return -1;
  return (s.batch_entry * p.tokens + p.block_tokens[first + j]) * p.heads + s.head;
}

// Where a staged segment comes from: the element offset of its first entry
// in the source array, or -1 where it is zero-filled (past the rows or the
// columns the source has).
MHLA_HD inline int64_t row_segment(int64_t row, int64_t column, int64_t width) {
  return row >= 0 && column < width ? row * width + column : -1;
}

// The summaries' arrays of slice bh: S [B*H, M, Dk, Dv] and z [B*H, M, Dk]
// (bfloat16 and float), element offsets of block b's.
MHLA_HD inline int64_t state_offset(const KernelProblem& p, int64_t bh, int64_t block) {
  return (bh * p.blocks + block) * p.dk * p.dv;
}
MHLA_HD inline int64_t normaliser_offset(const KernelProblem& p, int64_t bh, int64_t block) {
  return (bh * p.blocks + block) * p.dk;
}

// The mix's inner blocks [begin, end) for its rows [r0, r0 + kMixRows).
// Forward (S~ = W S) the rows are blocks i, and lower-triangular and Toeplitz
// rows stop at their own block; transposed (the backward's grad S = W^T
// grad S~) the rows are blocks b, read by the blocks i >= b only.
MHLA_HD inline bool triangular(const KernelProblem& p) { return p.lower_triangular() || p.toeplitz; }
MHLA_HD inline int64_t mix_inner_begin(const KernelProblem& p, int64_t r0, bool transposed) {
  return transposed && triangular(p) ? r0 : 0;
}
MHLA_HD inline int64_t mix_inner_end(const KernelProblem& p, int64_t r0, bool transposed) {
  return !transposed && triangular(p) && r0 + kMixRows < p.blocks ? r0 + kMixRows : p.blocks;
}

// The mix's operand at (row, inner block x): W[row, x], or W[x, row]
// transposed (zero past the blocks, past `end` and where the masking reads nothing).
MHLA_HD inline float mix_entry(const KernelProblem& p, const float* w, int64_t head, int64_t row,
                               int64_t x, int64_t end, bool transposed) {
  const int64_t i = transposed ? x : row, b = transposed ? row : x;
  return row < p.blocks && x < end && reads(p, i, b) ? weight(p, w, head, i, b) : 0.0f;
}

// The causal read-out's own-block keys for a CTA's tokens [c0, c0 +
// kReadTokens) of a block of `count` tokens: [0, own_keys_end).
MHLA_HD inline int own_keys_end(int c0, int count) {
  return c0 + kReadTokens < count ? c0 + kReadTokens : count;
}

// The read-out's chunks of kReadTokens tokens per block (of the largest block).
MHLA_HD inline int64_t read_chunks(const KernelProblem& p) {
  return ceil_div(p.largest_block, kReadTokens);
}

// The backward's query side and key and value side: one CTA per (block,
// slice), kGradChunk tokens of the block staged a step. The query side has a
// warp per 16 rows of Dk (summaries_warps), the key and value side
// kKeyValueWarps warps sharing the chunk's result fragments.
constexpr int kGradChunk = 32, kGradChunkFragments = kGradChunk / kFrag;
constexpr int kKeyValueWarps = 8;

// The weight gradient, sum over the slices of W's copy and the Dk Dv entries
// of each of grad S~[i] S[b] (plus grad z~[i] . z[b]): kWeightTile x
// kWeightTile tiles of W, each inner sum split into parts of whole chunks of
// kInnerChunk entries (W has few tiles, M = 256: 16, too few to fill a GPU),
// written apart and added in a fixed order, so repeated calls give the same bits.
constexpr int kWeightTile = 64, kWeightWarps = kWeightTile / kFrag;
constexpr int64_t kWeightCtas = 512;
struct WeightSplit {
  int64_t copies, splits, chunks_per_split;
  unsigned chunks_per_slice;  // Dk Dv / kInnerChunk (Dk, Dv multiples of 8)
  int64_t chunks;             // of one copy
};
MHLA_HD inline WeightSplit weight_split(const KernelProblem& p) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1;
  const int64_t slices = p.per_head_mixing ? p.batch : p.batch * p.heads;
  const unsigned per_slice = unsigned(p.dk * p.dv / kInnerChunk);
  const int64_t chunks = slices * per_slice, tiles = ceil_div(p.blocks, kWeightTile);
  int64_t splits = kWeightCtas / (tiles * tiles * copies);
  if (splits > chunks / 8) splits = chunks / 8;  // 8 chunks or more each
  if (splits > kMaxGridYZ / copies) splits = kMaxGridYZ / copies;
  if (splits < 1) splits = 1;
  const int64_t per_split = ceil_div(chunks, splits);
  return {copies, ceil_div(chunks, per_split), per_split, per_slice, chunks};
}
// The sum of the parts, with the normalisers' term grad z~[i] . z[b] over
// the copy's slices: kSumTile x kSumTile entries of W a CTA, one a thread,
// the tile's rows of grad z~ and z staged kSumChunk entries of Dk at a time,
// so that each row is read once a tile rather than once an entry (the term
// is Dk products a slice: 1,536 an entry at the video shape).
constexpr int kSumTile = 16, kSumChunk = 32;

// Chunk c of W's copy `copy`: its slice and its first entry of [Dk Dv], in
// 32-bit arithmetic.
struct WeightChunk {
  int64_t bh, first;
};
MHLA_HD inline WeightChunk weight_chunk(const KernelProblem& p, const WeightSplit& w,
                                        int64_t copy, int64_t c) {
  const unsigned slice = unsigned(c) / w.chunks_per_slice;
  const unsigned entry = unsigned(c) - slice * w.chunks_per_slice;
  const int64_t bh = p.per_head_mixing ? int64_t(slice) * p.heads + copy : int64_t(slice);
  return {bh, int64_t(entry) * kInnerChunk};
}

// Elements of each array of the state for a problem.
struct StateSizes {
  int64_t summaries, normalisers;  // S or S~ (bfloat16), z or z~ (float)
};
MHLA_HD inline StateSizes state_sizes(const KernelProblem& p) {
  const int64_t blocks = p.batch * p.heads * p.blocks;
  return {blocks * p.dk * p.dv, blocks * p.dk};
}

}  // namespace mhla::cuda::state
