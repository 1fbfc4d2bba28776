#include "cuda/bf16_state_mix.cuh"

#include "cuda/bf16_mix_kernels.cuh"
#include "cuda/bf16_state_device.cuh"
#include "cuda/cuda_check.hpp"

namespace mhla::cuda {
namespace {

using namespace state;

struct MixStage {
  bf16 w[kMixRows][kInnerChunk + kPad];
  bf16 s[kInnerChunk][kMixColumns + kPad];
};
union MixShared {
  MixStage stage[kStages];
  FragmentTile out[kMixWarps];
};

// Grid (kMixRows rows r, kMixColumns entries f of [Dk, Dv], slice bh):
// to[bh, r, f] = sum_x W[r, x] from[bh, x, f] (transposed: W[x, r]), W
// rounded to bfloat16 as it is staged.
template <bool kTransposed>
__global__ void __launch_bounds__(kMixWarps * 32)
    mix_kernel(KernelProblem p, const float* w, const uint16_t* from, uint16_t* to) {
  constexpr int kWeightSegments = kInnerChunk / kSegment, kStateSegments = kMixColumns / kSegment;
  __shared__ __align__(128) MixShared shared;

  const int64_t r0 = int64_t(blockIdx.x) * kMixRows, f0 = int64_t(blockIdx.y) * kMixColumns;
  const int64_t bh = blockIdx.z, width = p.dk * p.dv;
  const int64_t begin = mix_inner_begin(p, r0, kTransposed), end = mix_inner_end(p, r0, kTransposed);
  const int64_t head = slice_of(p, blockIdx.z).head;
  const uint16_t* slice = from + state_offset(p, bh, 0);
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](MixStage& st, int c) {
    const int64_t x0 = begin + int64_t(c) * kInnerChunk;
    for (int g = threadIdx.x; g < kMixRows * kWeightSegments; g += blockDim.x) {
      const Segment sg = segment_of<kWeightSegments>(g);
      float x[kSegment];
#pragma unroll
      for (int u = 0; u < kSegment; ++u)
        x[u] = mix_entry(p, w, head, r0 + sg.row, x0 + sg.column + u, end, kTransposed);
      store_rounded(reinterpret_cast<uint16_t*>(&st.w[sg.row][sg.column]), x);
    }
    for (int g = threadIdx.x; g < kInnerChunk * kStateSegments; g += blockDim.x) {
      const Segment sg = segment_of<kStateSegments>(g);
      const int64_t x = x0 + sg.row;
      stage_segment(&st.s[sg.row][sg.column], slice,
                    row_segment(x < end ? x : -1, f0 + sg.column, width));
    }
    commit_copies();
  };

  Accumulator acc[kMixColumns / kFrag];
#pragma unroll
  for (int n = 0; n < kMixColumns / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
  const int chunks = int(ceil_div(end - begin, kInnerChunk));
  pipelined(shared.stage, chunks, stage_chunk, [&](const MixStage& st, int) {
#pragma unroll
    for (int step = 0; step < kInnerChunk; step += kFrag) {
      OperandA<wmma::row_major> a;
      wmma::load_matrix_sync(a, &st.w[warp * kFrag][step], kInnerChunk + kPad);
#pragma unroll
      for (int n = 0; n < kMixColumns / kFrag; ++n) {
        OperandB<wmma::row_major> b;
        wmma::load_matrix_sync(b, &st.s[step][n * kFrag], kMixColumns + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
  });

#pragma unroll
  for (int n = 0; n < kMixColumns / kFrag; ++n)
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
      const int64_t r = r0 + warp * kFrag + ls.row, f = f0 + n * kFrag + ls.column;
      if (r < p.blocks && f < width) store_rounded(to + state_offset(p, bh, r) + f, x);
    });
}

// Grid (row r, slice bh), one thread per entry d of Dk:
// to_z[bh, r, d] = sum_x W[r, x] from_z[bh, x, d] (transposed: W[x, r]), in float.
__global__ void mix_normalisers_kernel(KernelProblem p, const float* w, bool transposed,
                                       const float* from_z, float* to_z) {
  const int64_t r = blockIdx.x, bh = blockIdx.y, d = threadIdx.x;
  const int64_t head = slice_of(p, blockIdx.y).head;
  const int64_t end = mix_inner_end(p, r, transposed);
  float sum = 0;
  for (int64_t x = mix_inner_begin(p, r, transposed); x < end; ++x) {
    const int64_t i = transposed ? x : r, b = transposed ? r : x;
    if (reads(p, i, b)) sum += weight(p, w, head, i, b) * from_z[normaliser_offset(p, bh, x) + d];
  }
  to_z[normaliser_offset(p, bh, r) + d] = sum;
}

struct WeightStage {
  bf16 grad[kWeightTile][kInnerChunk + kPad];   // grad S~[bh, i0 + r, chunk]
  bf16 state[kWeightTile][kInnerChunk + kPad];  // S[bh, b0 + r, chunk]
};
union WeightShared {
  WeightStage stage[kStages];
  FragmentTile out[kWeightWarps];
};

// Grid (kWeightTile rows i of W, kWeightTile columns b, copy x split): one
// split's part of sum over the copy's chunks of grad S~[bh, i, f] S[bh, b, f],
// written to partials[copy, split] ([M, M] each).
__global__ void __launch_bounds__(kWeightWarps * 32)
    weight_partials_kernel(KernelProblem p, WeightSplit split, const uint16_t* grad_mixed,
                           const uint16_t* s, float* partials) {
  constexpr int kSegments = kInnerChunk / kSegment;
  __shared__ __align__(128) WeightShared shared;

  const int64_t i0 = int64_t(blockIdx.x) * kWeightTile, b0 = int64_t(blockIdx.y) * kWeightTile;
  const int64_t copy = blockIdx.z / unsigned(split.splits);
  const int64_t part = blockIdx.z - unsigned(copy) * unsigned(split.splits);
  const int64_t first = part * split.chunks_per_split;
  const int64_t last = first + split.chunks_per_split < split.chunks ? first + split.chunks_per_split
                                                                     : split.chunks;
  const int64_t m = p.blocks;
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](WeightStage& st, int c) {
    const WeightChunk chunk = weight_chunk(p, split, copy, first + c);
    for (int g = threadIdx.x; g < kWeightTile * kSegments; g += blockDim.x) {
      const Segment sg = segment_of<kSegments>(g);
      const int64_t i = i0 + sg.row, b = b0 + sg.row, f = chunk.first + sg.column;
      stage_segment(&st.grad[sg.row][sg.column], grad_mixed,
                    i < m ? state_offset(p, chunk.bh, i) + f : -1);
      stage_segment(&st.state[sg.row][sg.column], s, b < m ? state_offset(p, chunk.bh, b) + f : -1);
    }
    commit_copies();
  };

  Accumulator acc[kWeightTile / kFrag];
#pragma unroll
  for (int n = 0; n < kWeightTile / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
  pipelined(shared.stage, int(last - first), stage_chunk, [&](const WeightStage& st, int) {
#pragma unroll
    for (int step = 0; step < kInnerChunk; step += kFrag) {
      OperandA<wmma::row_major> a;  // grad S~: entry (i, f) at grad[i][f]
      wmma::load_matrix_sync(a, &st.grad[warp * kFrag][step], kInnerChunk + kPad);
#pragma unroll
      for (int n = 0; n < kWeightTile / kFrag; ++n) {
        OperandB<wmma::col_major> b;  // S^T: entry (f, b) at state[b][f]
        wmma::load_matrix_sync(b, &st.state[n * kFrag][step], kInnerChunk + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
  });

  float* to = partials + (copy * split.splits + part) * m * m;
#pragma unroll
  for (int n = 0; n < kWeightTile / kFrag; ++n)
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
      const int64_t i = i0 + warp * kFrag + ls.row;
      if (i >= m) return;
      for (int u = 0; u < kSegment; ++u) {
        const int64_t b = b0 + n * kFrag + ls.column + u;
        if (b < m) to[i * m + b] = x[u];
      }
    });
}

// Per (copy, i, b): the splits' partial sums added in order, then the
// normalisers' term over the copy's slices in order (token-level causal
// W[i, i], which the mix does not read: its own-block parts over the slices
// instead); kept in the copy's first split (the dense gradient, which
// Toeplitz W sums further) and, for dense W, added to the entries the
// operator uses. A CTA takes a kSumTile x kSumTile tile of W and stages the
// tile's rows of grad z~ and z, kSumChunk entries of Dk at a time; each
// thread adds its entry's products in the order of (slice, d).
__global__ void __launch_bounds__(kSumTile * kSumTile)
    weight_sum_kernel(KernelProblem p, WeightSplit split, const float* grad_mixed_z, const float* z,
                      const float* diagonal, float* partials, float* grad_w, int* non_finite) {
  __shared__ float rows_gz[kSumTile][kSumChunk + 1], rows_z[kSumTile][kSumChunk + 1];
  const int64_t m = p.blocks, copy = blockIdx.z;
  const int64_t slices = p.per_head_mixing ? p.batch : p.batch * p.heads;
  const int ti = int(threadIdx.x) / kSumTile, tb = int(threadIdx.x) % kSumTile;
  const int64_t i0 = int64_t(blockIdx.y) * kSumTile, b0 = int64_t(blockIdx.x) * kSumTile;
  const int64_t i = i0 + ti, b = b0 + tb;
  const bool inside = i < m && b < m;
  float* first = inside ? partials + copy * split.splits * m * m + i * m + b : nullptr;
  float sum = 0;
  if (inside)
    for (int64_t part = 0; part < split.splits; ++part) sum += first[part * m * m];
  for (int64_t slice = 0; slice < slices; ++slice) {
    const int64_t bh = p.per_head_mixing ? slice * p.heads + copy : slice;
    for (int64_t d0 = 0; d0 < p.dk; d0 += kSumChunk) {
      const int width = int(p.dk - d0 < kSumChunk ? p.dk - d0 : kSumChunk);
      __syncthreads();  // the previous chunk's rows are read
      for (int g = threadIdx.x; g < kSumTile * kSumChunk; g += blockDim.x) {
        const int row = g / kSumChunk, d = g % kSumChunk;
        if (d >= width) continue;
        if (i0 + row < m) rows_gz[row][d] = grad_mixed_z[normaliser_offset(p, bh, i0 + row) + d0 + d];
        if (b0 + row < m) rows_z[row][d] = z[normaliser_offset(p, bh, b0 + row) + d0 + d];
      }
      __syncthreads();
      if (inside)
        for (int d = 0; d < width; ++d) sum += rows_gz[ti][d] * rows_z[tb][d];
    }
  }
  if (!inside) return;
  if (p.causal && i == b) {
    sum = 0;
    for (int64_t slice = 0; slice < slices; ++slice)
      sum += diagonal[(p.per_head_mixing ? slice * p.heads + copy : slice) * m + i];
  }
  *first = sum;
  if (p.toeplitz || !uses(p, i, b)) return;
  float& entry = grad_w[(copy * p.w_stride + i) * p.w_stride + b];
  entry += sum;
  if (!isfinite(entry)) atomicOr(non_finite, 1);
}

}  // namespace

void bf16_state_mix(const KernelProblem& p, const float* w, bool transposed, const uint16_t* from,
                    const float* from_z, uint16_t* to, float* to_z, cudaStream_t stream) {
  const unsigned slices = unsigned(p.batch * p.heads);
  const dim3 grid(unsigned(ceil_div(p.blocks, kMixRows)),
                  unsigned(ceil_div(p.dk * p.dv, kMixColumns)), slices);
  if (transposed)
    mix_kernel<true><<<grid, kMixWarps * 32, 0, stream>>>(p, w, from, to);
  else
    mix_kernel<false><<<grid, kMixWarps * 32, 0, stream>>>(p, w, from, to);
  check_launch("bf16-state mix kernel");
  mix_normalisers_kernel<<<dim3(unsigned(p.blocks), slices), unsigned(p.dk), 0, stream>>>(
      p, w, transposed, from_z, to_z);
  check_launch("bf16-state normalisers' mix kernel");
}

int64_t bf16_state_weight_scratch(const KernelProblem& p) {
  const WeightSplit split = weight_split(p);
  return split.copies * split.splits * p.blocks * p.blocks;
}

void bf16_state_weight_gradient(const KernelProblem& p, const uint16_t* grad_mixed,
                                const float* grad_mixed_z, const uint16_t* s, const float* z,
                                const float* diagonal, float* grad_w, float* scratch,
                                int* non_finite, cudaStream_t stream) {
  const WeightSplit split = weight_split(p);
  const unsigned tiles = unsigned(ceil_div(p.blocks, kWeightTile));
  weight_partials_kernel<<<dim3(tiles, tiles, unsigned(split.copies * split.splits)),
                           kWeightWarps * 32, 0, stream>>>(p, split, grad_mixed, s, scratch);
  check_launch("bf16-state weight gradient kernel");
  const unsigned sum_tiles = unsigned(ceil_div(p.blocks, kSumTile));
  weight_sum_kernel<<<dim3(sum_tiles, sum_tiles, unsigned(split.copies)), kSumTile * kSumTile, 0,
                      stream>>>(p, split, grad_mixed_z, z, diagonal, scratch, grad_w, non_finite);
  check_launch("bf16-state weight gradient sum kernel");
  if (p.toeplitz) bf16_toeplitz_weight_gradient(p, split.splits, scratch, grad_w, non_finite, stream);
}

}  // namespace mhla::cuda
