#include "cuda/bf16_mix_kernels.cuh"

#include <algorithm>

#include "cuda/bf16_tiles.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace tiles;

// Grid (64 result rows, 64 columns of the summaries, slice bh), on one
// slice's [M, Dk (Dv + 1)] arrays: the mix, to = W from, or its backward,
// to = W^T from. W's entries come in as the masking lets each row read them.
template <bool kTransposed>
__global__ void __launch_bounds__(kThreads)
    mix_kernel(KernelProblem p, const float* w, const float* from, float* to) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;

  const int64_t r0 = int64_t(blockIdx.x) * kTile, f0 = int64_t(blockIdx.y) * kTile, bh = blockIdx.z;
  const int64_t width = p.dk * (p.dv + 1), h = bh % p.heads;
  const float* slice = from + bh * p.blocks * width;
  // Lower-triangular and Toeplitz rows read no block past their own: the
  // mix's rows stop at the tile's last row, the transposed sums start at its first.
  const bool triangular = p.lower_triangular() || p.toeplitz;
  const int64_t begin = kTransposed && triangular ? r0 : 0;
  const int64_t end = !kTransposed && triangular && r0 + kTile < p.blocks ? r0 + kTile : p.blocks;

  Accumulators acc;
  clear(acc);
  rows_product<BLoad::by_column>(
      acc, stage, begin, end,
      [&](int r, int64_t x) {
        const int64_t row = kTransposed ? x : r0 + r, col = kTransposed ? r0 + r : x;
        return r0 + r < p.blocks && reads(p, row, col) ? weight(p, w, h, row, col) : 0.0f;
      },
      [&](int64_t x, int j) { return f0 + j < width ? slice[x * width + f0 + j] : 0.0f; },
      NothingPerStage{});

  store_rows(acc, out);
  __syncthreads();
  float* dst = to + bh * p.blocks * width;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int i = e / kTile, j = e % kTile;
    if (r0 + i < p.blocks && f0 + j < width) dst[(r0 + i) * width + f0 + j] = out[i][j];
  }
}

// How the weight gradient's inner sum, over the slices of one W copy and the
// Dk (Dv + 1) entries of each, is split among CTAs: W has few 64 x 64 tiles
// (M = 256: 16), too few to fill a GPU, so each tile's sum is split into
// about kWeightCtas / tiles parts of whole chunks, summed afterwards in order.
constexpr int64_t kWeightCtas = 512;

struct WeightSplit {
  int64_t copies, splits, per_split;  // per_split: inner entries, a multiple of kChunk
};

WeightSplit weight_split(const KernelProblem& p) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1;
  const int64_t total = (p.per_head_mixing ? p.batch : p.batch * p.heads) * p.dk * (p.dv + 1);
  const int64_t w_tiles = tile_count(p.blocks) * tile_count(p.blocks);
  int64_t splits = std::max<int64_t>(1, kWeightCtas / (w_tiles * copies));
  splits = std::min(splits, std::max<int64_t>(1, total / (8 * kChunk)));  // 8 chunks or more each
  splits = std::min(splits, kMaxGridYZ / copies);
  const int64_t per_split = ((total + splits - 1) / splits + kChunk - 1) / kChunk * kChunk;
  return {copies, (total + per_split - 1) / per_split, per_split};
}

// Grid (64 rows i of W, 64 columns b, copy x split): one split's part of
// sum over (slice of the copy, entry c) of grad_mixed[slice, i, c] summaries[slice, b, c],
// written to partials[copy, split] ([M, M] each).
__global__ void __launch_bounds__(kThreads)
    weight_partials_kernel(KernelProblem p, int64_t splits, int64_t per_split,
                           const float* grad_mixed, const float* s, float* partials) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;

  const int64_t i0 = int64_t(blockIdx.x) * kTile, b0 = int64_t(blockIdx.y) * kTile;
  const int64_t copy = blockIdx.z / splits, split = blockIdx.z % splits;
  const int64_t m = p.blocks, width = p.dk * (p.dv + 1);
  const int64_t total = (p.per_head_mixing ? p.batch : p.batch * p.heads) * width;
  const int64_t begin = split * per_split,
                end = begin + per_split < total ? begin + per_split : total;
  // Entry x of the inner sum: entry x % width of block `block` in the copy's slice x / width.
  const auto at = [&](const float* array, int64_t x, int64_t block) {
    const int64_t slice = x / width, bh = p.per_head_mixing ? slice * p.heads + copy : slice;
    return array[(bh * m + block) * width + x % width];
  };

  Accumulators acc;
  clear(acc);
  rows_product<BLoad::by_inner>(
      acc, stage, begin, end,
      [&](int i, int64_t x) { return i0 + i < m ? at(grad_mixed, x, i0 + i) : 0.0f; },
      [&](int64_t x, int b) { return b0 + b < m ? at(s, x, b0 + b) : 0.0f; }, NothingPerStage{});

  store_rows(acc, out);
  __syncthreads();
  float* dst = partials + (copy * splits + split) * m * m;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int i = e / kTile, b = e % kTile;
    if (i0 + i < m && b0 + b < m) dst[(i0 + i) * m + b0 + b] = out[i][b];
  }
}

// Per (copy, i, b): the splits' partial sums added in order (for W[i, i]
// under token-level causal masking, its in-block terms instead, per slice and
// chunk in order), kept in the copy's first split (the dense gradient, which
// Toeplitz W sums further) and, for dense W, added to the entries the
// operator uses.
__global__ void weight_sum_kernel(KernelProblem p, int64_t splits, int64_t chunks,
                                  const float* diagonal, float* partials, float* grad_w,
                                  int* non_finite) {
  const int64_t m = p.blocks, copies = p.per_head_mixing ? p.heads : 1, total = copies * m * m;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ib = idx % (m * m), i = ib / m, b = ib % m, copy = idx / (m * m);
    float* first = partials + copy * splits * m * m + ib;
    float sum = 0;
    if (p.causal && i == b) {
      const int64_t slices = p.per_head_mixing ? p.batch : p.batch * p.heads;
      for (int64_t slice = 0; slice < slices; ++slice) {
        const int64_t bh = p.per_head_mixing ? slice * p.heads + copy : slice;
        for (int64_t c = 0; c < chunks; ++c) sum += diagonal[(bh * m + i) * chunks + c];
      }
    } else {
      for (int64_t split = 0; split < splits; ++split) sum += first[split * m * m];
    }
    *first = sum;
    if (p.toeplitz || !uses(p, i, b)) continue;
    float& entry = grad_w[(copy * p.w_stride + i) * p.w_stride + b];
    entry += sum;
    if (!isfinite(entry)) atomicOr(non_finite, 1);
  }
}

// Per (copy, d): Toeplitz entry d gathers the dense gradient where
// min(i - b, L) = d, i >= b, in a fixed order.
__global__ void toeplitz_weight_kernel(KernelProblem p, int64_t splits, const float* dense,
                                       float* grad_w, int* non_finite) {
  const int64_t m = p.blocks, length = p.toeplitz_length;
  const int64_t copies = p.per_head_mixing ? p.heads : 1, total = copies * (length + 1);
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % (length + 1), copy = idx / (length + 1);
    float& entry = grad_w[copy * (length + 1) + d];
    entry += toeplitz_entry_gradient(p, dense + copy * splits * m * m, d);
    if (!isfinite(entry)) atomicOr(non_finite, 1);
  }
}

dim3 mix_grid(const KernelProblem& p) {
  return dim3(unsigned(tile_count(p.blocks)), unsigned(tile_count(p.dk * (p.dv + 1))),
              unsigned(p.batch * p.heads));
}

}  // namespace

void bf16_mix(const KernelProblem& p, const float* w, const float* summaries, float* mixed,
              cudaStream_t stream) {
  mix_kernel<false><<<mix_grid(p), kThreads, 0, stream>>>(p, w, summaries, mixed);
  check_launch("bf16 mix kernel");
}

int64_t bf16_mix_backward_scratch(const KernelProblem& p) {
  const WeightSplit split = weight_split(p);
  return split.copies * split.splits * p.blocks * p.blocks;
}

void bf16_mix_backward(const KernelProblem& p, const float* w, const float* summaries,
                       const float* grad_mixed, const float* diagonal, float* grad_summaries,
                       float* grad_w, float* scratch, int* non_finite, cudaStream_t stream) {
  mix_kernel<true><<<mix_grid(p), kThreads, 0, stream>>>(p, w, grad_mixed, grad_summaries);
  check_launch("bf16 mix backward kernel");
  if (grad_w == nullptr) return;
  const WeightSplit split = weight_split(p);
  const dim3 grid(unsigned(tile_count(p.blocks)), unsigned(tile_count(p.blocks)),
                  unsigned(split.copies * split.splits));
  weight_partials_kernel<<<grid, kThreads, 0, stream>>>(p, split.splits, split.per_split,
                                                        grad_mixed, summaries, scratch);
  check_launch("bf16 weight gradient kernel");
  weight_sum_kernel<<<elementwise_blocks(split.copies * p.blocks * p.blocks), kThreads, 0,
                      stream>>>(p, split.splits, tile_count(p.largest_block), diagonal, scratch,
                                grad_w, non_finite);
  check_launch("bf16 weight gradient sum kernel");
  if (p.toeplitz) bf16_toeplitz_weight_gradient(p, split.splits, scratch, grad_w, non_finite, stream);
}

void bf16_toeplitz_weight_gradient(const KernelProblem& p, int64_t splits, const float* dense,
                                   float* grad_w, int* non_finite, cudaStream_t stream) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1;
  toeplitz_weight_kernel<<<elementwise_blocks(copies * (p.toeplitz_length + 1)), kThreads, 0,
                           stream>>>(p, splits, dense, grad_w, non_finite);
  check_launch("bf16 Toeplitz weight gradient kernel");
}

}  // namespace mhla::cuda
