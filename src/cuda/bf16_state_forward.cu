#include "cuda/bf16_state_forward.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include "cuda/bf16_state_plan.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace state;
using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;
using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;
template <class Layout>
using OperandA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, Layout>;
using OperandB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major>;
// One warp's 16 x 16 float results on their way out (fragment layouts are
// opaque, so results pass through shared memory once).
using FragmentTile = float[kFrag][kFrag + kOutPad];

// 16 bytes from global to shared memory without passing through registers;
// where `inside` is false nothing is read and the 16 bytes are zeros.
__device__ inline void copy_async(void* to, const void* from, bool inside) {
  const unsigned shared = unsigned(__cvta_generic_to_shared(to));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(from),
               "r"(inside ? 16 : 0));
}
__device__ inline void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending groups of this thread's copies are in flight.
template <int kPending>
__device__ inline void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The double-buffered main loop over `chunks` staged chunks: chunk c + 1's
// copies are in flight while chunk c is consumed. stage(st, c) issues and
// commits chunk c's copies into the stage buffer st; consume(st, c) runs
// between the barriers that make st readable and then free again.
template <class Buffers, class Stage, class Consume>
__device__ void pipelined(Buffers& buffers, int chunks, const Stage& stage,
                          const Consume& consume) {
  stage(buffers[0], 0);
  for (int c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) {
      stage(buffers[(c + 1) % kStages], c + 1);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    consume(buffers[c % kStages], c);
    __syncthreads();
  }
  wait_copies<0>();  // with no chunk at all the first copies are still in flight
  __syncthreads();
}

// One staged segment from `base` at element `offset` (bf16_state_plan.hpp:
// -1 zero-fills it).
__device__ inline void stage_segment(bf16* to, const uint16_t* base, int64_t offset) {
  copy_async(to, offset >= 0 ? base + offset : base, offset >= 0);
}

// phi on an operand fragment, in registers. Zero-filled entries become
// phi(0) (1 for elu1); each meets a zero-filled entry of the other operand.
template <class Fragment>
__device__ inline void apply_feature(FeatureMap phi, Fragment& f) {
  if (phi == FeatureMap::identity) return;
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i)
    f.x[i] = __float2bfloat16_rn(feature(phi, __bfloat162float(f.x[i])));
}

__device__ inline uint32_t pair(float a, float b) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}
// 8 floats rounded to bfloat16, as one 16-byte store.
__device__ inline void store_rounded(uint16_t* to, const float (&x)[kSegment]) {
  *reinterpret_cast<uint4*>(to) =
      make_uint4(pair(x[0], x[1]), pair(x[2], x[3]), pair(x[4], x[5]), pair(x[6], x[7]));
}

// This warp's fragment through its tile: write(lane's segment, its 8 values).
template <class Write>
__device__ inline void write_fragment(const Accumulator& acc, FragmentTile& tile,
                                      const Write& write) {
  wmma::store_matrix_sync(&tile[0][0], acc, kFrag + kOutPad, wmma::mem_row_major);
  __syncwarp();
  const Segment s = lane_segment(int(threadIdx.x % 32));
  float x[kSegment];
#pragma unroll
  for (int u = 0; u < kSegment; ++u) x[u] = tile[s.row][s.column + u];
  write(s, x);
  __syncwarp();
}

template <int kColumnFragments>
struct SummariesStage {
  bf16 k[kKeyChunk][kMaxDim + kPad];
  bf16 v[kKeyChunk][kColumnFragments * kFrag + kPad];
};
template <int kColumnFragments>
union SummariesShared {
  SummariesStage<kColumnFragments> stage[kStages];
  FragmentTile out[kMaxDim / kFrag];
};

// Grid (block b, slice bh), one warp per 16 rows of Dk: S_b = phi(K_b)^T V_b
// (bfloat16 rows) and z_b = the sum of phi(k) (float), kKeyChunk tokens a step.
template <int kColumnFragments>
__global__ void __launch_bounds__(kMaxDim / kFrag * 32)
    summaries_kernel(KernelProblem p, const uint16_t* k, const uint16_t* v, uint16_t* s,
                     float* z) {
  constexpr int kKeySegments = kMaxDim / kSegment;
  constexpr int kValueSegments = kColumnFragments * kFrag / kSegment;
  using Stage = SummariesStage<kColumnFragments>;
  __shared__ __align__(128) SummariesShared<kColumnFragments> shared;

  const int64_t block = blockIdx.x, bh = blockIdx.y;
  const Slice slice = slice_of(p, blockIdx.y);
  const int count = int(p.block_start[block + 1] - p.block_start[block]);
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](Stage& st, int c) {
    const int c0 = c * kKeyChunk;
    for (int g = threadIdx.x; g < kKeyChunk * kKeySegments; g += blockDim.x) {
      const Segment sg = segment_of<kKeySegments>(g);
      stage_segment(&st.k[sg.row][sg.column], k,
                    row_segment(block_token_row(p, slice, block, c0 + sg.row), sg.column, p.dk));
    }
    for (int g = threadIdx.x; g < kKeyChunk * kValueSegments; g += blockDim.x) {
      const Segment sg = segment_of<kValueSegments>(g);
      stage_segment(&st.v[sg.row][sg.column], v,
                    row_segment(block_token_row(p, slice, block, c0 + sg.row), sg.column, p.dv));
    }
    commit_copies();
  };

  Accumulator acc[kColumnFragments];
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n) wmma::fill_fragment(acc[n], 0.0f);
  float normaliser = 0;  // z_b's entry threadIdx.x
  const int chunks = int(ceil_div(count, kKeyChunk));
  pipelined(shared.stage, chunks, stage_chunk, [&](const Stage& st, int c) {
    const int c0 = c * kKeyChunk, valid = count - c0 < kKeyChunk ? count - c0 : kKeyChunk;
    if (threadIdx.x < p.dk)
      for (int j = 0; j < valid; ++j)
        normaliser += feature(p.phi, __bfloat162float(st.k[j][threadIdx.x]));
#pragma unroll
    for (int step = 0; step < kKeyChunk; step += kFrag) {
      if (step >= valid) break;  // the rest of the chunk is past the block
      OperandA<wmma::col_major> a;  // phi(K)^T: entry (d, j) at k[j][d]
      wmma::load_matrix_sync(a, &st.k[step][warp * kFrag], kMaxDim + kPad);
      apply_feature(p.phi, a);
#pragma unroll
      for (int n = 0; n < kColumnFragments; ++n) {
        OperandB b;
        wmma::load_matrix_sync(b, &st.v[step][n * kFrag], kColumnFragments * kFrag + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
  });

  uint16_t* s_b = s + state_offset(p, bh, block);
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n)
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
      const int64_t d = warp * kFrag + ls.row, e = n * kFrag + ls.column;
      if (d < p.dk && e < p.dv) store_rounded(s_b + d * p.dv + e, x);
    });
  if (threadIdx.x < p.dk) z[normaliser_offset(p, bh, block) + threadIdx.x] = normaliser;
}

struct MixStage {
  bf16 w[kMixRows][kInnerChunk + kPad];
  bf16 s[kInnerChunk][kMixColumns + kPad];
};
union MixShared {
  MixStage stage[kStages];
  FragmentTile out[kMixWarps];
};

// Grid (kMixRows rows i, kMixColumns entries f of [Dk, Dv], slice bh):
// S~[bh, i, f] = sum_b W[i, b] S[bh, b, f], W rounded to bfloat16 as it is staged.
__global__ void __launch_bounds__(kMixWarps * 32)
    mix_kernel(KernelProblem p, const float* w, const uint16_t* s, uint16_t* mixed) {
  constexpr int kWeightSegments = kInnerChunk / kSegment, kStateSegments = kMixColumns / kSegment;
  __shared__ __align__(128) MixShared shared;

  const int64_t r0 = int64_t(blockIdx.x) * kMixRows, f0 = int64_t(blockIdx.y) * kMixColumns;
  const int64_t bh = blockIdx.z, width = p.dk * p.dv, end = mix_inner_end(p, r0);
  const int64_t head = slice_of(p, blockIdx.z).head;
  const uint16_t* slice = s + state_offset(p, bh, 0);
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](MixStage& st, int c) {
    const int64_t b0 = int64_t(c) * kInnerChunk;
    for (int g = threadIdx.x; g < kMixRows * kWeightSegments; g += blockDim.x) {
      const Segment sg = segment_of<kWeightSegments>(g);
      float x[kSegment];
#pragma unroll
      for (int u = 0; u < kSegment; ++u)
        x[u] = mix_entry(p, w, head, r0 + sg.row, b0 + sg.column + u, end);
      store_rounded(reinterpret_cast<uint16_t*>(&st.w[sg.row][sg.column]), x);
    }
    for (int g = threadIdx.x; g < kInnerChunk * kStateSegments; g += blockDim.x) {
      const Segment sg = segment_of<kStateSegments>(g);
      const int64_t b = b0 + sg.row;
      stage_segment(&st.s[sg.row][sg.column], slice,
                    row_segment(b < end ? b : -1, f0 + sg.column, width));
    }
    commit_copies();
  };

  Accumulator acc[kMixColumns / kFrag];
#pragma unroll
  for (int n = 0; n < kMixColumns / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
  const int chunks = int(ceil_div(end, kInnerChunk));
  pipelined(shared.stage, chunks, stage_chunk, [&](const MixStage& st, int) {
#pragma unroll
    for (int step = 0; step < kInnerChunk; step += kFrag) {
      OperandA<wmma::row_major> a;
      wmma::load_matrix_sync(a, &st.w[warp * kFrag][step], kInnerChunk + kPad);
#pragma unroll
      for (int n = 0; n < kMixColumns / kFrag; ++n) {
        OperandB b;
        wmma::load_matrix_sync(b, &st.s[step][n * kFrag], kMixColumns + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
  });

#pragma unroll
  for (int n = 0; n < kMixColumns / kFrag; ++n)
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
      const int64_t i = r0 + warp * kFrag + ls.row, f = f0 + n * kFrag + ls.column;
      if (i < p.blocks && f < width) store_rounded(mixed + state_offset(p, bh, i) + f, x);
    });
}

// Grid (row i, slice bh), one thread per entry d of Dk:
// z~[bh, i, d] = sum_b W[i, b] z[bh, b, d], in float.
__global__ void mix_normalisers_kernel(KernelProblem p, const float* w, const float* z,
                                       float* mixed_z) {
  const int64_t i = blockIdx.x, bh = blockIdx.y, d = threadIdx.x;
  const int64_t head = slice_of(p, blockIdx.y).head, end = mix_inner_end(p, i);
  float sum = 0;
  for (int64_t b = 0; b < end; ++b)
    if (reads(p, i, b)) sum += weight(p, w, head, i, b) * z[normaliser_offset(p, bh, b) + d];
  mixed_z[normaliser_offset(p, bh, i) + d] = sum;
}

template <int kColumnFragments>
struct ReadStage {
  bf16 q[kReadTokens][kInnerChunk + kPad];
  bf16 s[kInnerChunk][kColumnFragments * kFrag + kPad];
};
template <int kColumnFragments>
union ReadShared {
  ReadStage<kColumnFragments> stage[kStages];
  FragmentTile out[kReadWarps];
};

// Grid (block i x chunk of kReadTokens tokens, slice bh): o_t = phi(q_t)^T S~_i
// / (phi(q_t) . z~_i + eps), or scale phi(q_t)^T S~_i, over all of Dv.
template <int kColumnFragments>
__global__ void __launch_bounds__(kReadWarps * 32)
    outputs_kernel(KernelProblem p, unsigned chunks, const uint16_t* q, const uint16_t* mixed,
                   const float* mixed_z, uint16_t* o, int* non_finite) {
  constexpr int kQuerySegments = kInnerChunk / kSegment;
  constexpr int kStateSegments = kColumnFragments * kFrag / kSegment;
  using Stage = ReadStage<kColumnFragments>;
  __shared__ __align__(128) ReadShared<kColumnFragments> shared;
  __shared__ int64_t rows[kReadTokens];
  __shared__ float denominators[kReadTokens];

  const unsigned block32 = blockIdx.x / chunks;
  const int64_t block = block32, bh = blockIdx.y;
  const int64_t c0 = int64_t(blockIdx.x - block32 * chunks) * kReadTokens;
  const Slice slice = slice_of(p, blockIdx.y);
  if (c0 >= p.block_start[block + 1] - p.block_start[block]) return;  // before any barrier
  if (threadIdx.x < kReadTokens)
    rows[threadIdx.x] = block_token_row(p, slice, block, c0 + threadIdx.x);
  __syncthreads();
  const uint16_t* state = mixed + state_offset(p, bh, block);
  const float* z = mixed_z + normaliser_offset(p, bh, block);
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](Stage& st, int c) {
    const int64_t a0 = int64_t(c) * kInnerChunk;
    for (int g = threadIdx.x; g < kReadTokens * kQuerySegments; g += blockDim.x) {
      const Segment sg = segment_of<kQuerySegments>(g);
      stage_segment(&st.q[sg.row][sg.column], q, row_segment(rows[sg.row], a0 + sg.column, p.dk));
    }
    for (int g = threadIdx.x; g < kInnerChunk * kStateSegments; g += blockDim.x) {
      const Segment sg = segment_of<kStateSegments>(g);
      const int64_t a = a0 + sg.row;
      stage_segment(&st.s[sg.row][sg.column], state, row_segment(a < p.dk ? a : -1, sg.column, p.dv));
    }
    commit_copies();
  };

  Accumulator acc[kColumnFragments];
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n) wmma::fill_fragment(acc[n], 0.0f);
  float den = 0;  // the denominator of the chunk's token threadIdx.x
  const int chunks_k = int(ceil_div(p.dk, kInnerChunk));
  pipelined(shared.stage, chunks_k, stage_chunk, [&](const Stage& st, int c) {
    const int a0 = c * kInnerChunk;
    const int valid = int(p.dk) - a0 < kInnerChunk ? int(p.dk) - a0 : kInnerChunk;
    if (threadIdx.x < kReadTokens)
      for (int a = 0; a < valid; ++a)
        den += feature(p.phi, __bfloat162float(st.q[threadIdx.x][a])) * z[a0 + a];
#pragma unroll
    for (int step = 0; step < kInnerChunk; step += kFrag) {
      if (step >= valid) break;  // the rest of the chunk is past Dk
      OperandA<wmma::row_major> a;
      wmma::load_matrix_sync(a, &st.q[warp * kFrag][step], kInnerChunk + kPad);
      apply_feature(p.phi, a);
#pragma unroll
      for (int n = 0; n < kColumnFragments; ++n) {
        OperandB b;
        wmma::load_matrix_sync(b, &st.s[step][n * kFrag], kColumnFragments * kFrag + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
  });
  if (threadIdx.x < kReadTokens) denominators[threadIdx.x] = den;
  __syncthreads();

  bool bad = false;
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n)
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float (&y)[kSegment]) {
      const int t = warp * kFrag + ls.row;
      const int64_t e = n * kFrag + ls.column;
      if (rows[t] < 0 || e >= p.dv) return;
      const float d = denominators[t], inverse = 1.0f / (d + float(p.eps));
      float r[kSegment];
#pragma unroll
      for (int u = 0; u < kSegment; ++u) {
        r[u] = p.normalize ? y[u] * inverse : float(p.scale) * y[u];
        bad = bad || !isfinite(r[u]);
      }
      bad = bad || (p.normalize && !isfinite(d));
      store_rounded(o + rows[t] * p.dv + e, r);
    });
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(non_finite, 1);
}

bool aligned(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace

bool bf16_state_forward_fits(const KernelProblem& p, const void* q, const void* k, const void* v,
                             const void* o) {
  return state::fits(p) && aligned(q) && aligned(k) && aligned(v) && aligned(o);
}

void bf16_state_forward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                        const uint16_t* v, const float* w, uint16_t* o, const Bf16State& state,
                        int* non_finite, cudaStream_t stream) {
  const unsigned slices = unsigned(p.batch * p.heads), blocks = unsigned(p.blocks);
  const bool wide = column_fragments(p.dv) == 8;
  const unsigned summary_threads = unsigned(32 * summaries_warps(p.dk));
  if (wide)
    summaries_kernel<8><<<dim3(blocks, slices), summary_threads, 0, stream>>>(
        p, k, v, state.summaries, state.normalisers);
  else
    summaries_kernel<4><<<dim3(blocks, slices), summary_threads, 0, stream>>>(
        p, k, v, state.summaries, state.normalisers);
  check_launch("bf16-state summaries kernel");

  const dim3 mix_grid(unsigned(ceil_div(p.blocks, kMixRows)),
                      unsigned(ceil_div(p.dk * p.dv, kMixColumns)), slices);
  mix_kernel<<<mix_grid, kMixWarps * 32, 0, stream>>>(p, w, state.summaries, state.mixed);
  check_launch("bf16-state mix kernel");
  mix_normalisers_kernel<<<dim3(blocks, slices), unsigned(p.dk), 0, stream>>>(
      p, w, state.normalisers, state.mixed_normalisers);
  check_launch("bf16-state normalisers' mix kernel");

  const unsigned chunks = unsigned(read_chunks(p));
  const dim3 read_grid(blocks * chunks, slices);
  if (wide)
    outputs_kernel<8><<<read_grid, kReadWarps * 32, 0, stream>>>(
        p, chunks, q, state.mixed, state.mixed_normalisers, o, non_finite);
  else
    outputs_kernel<4><<<read_grid, kReadWarps * 32, 0, stream>>>(
        p, chunks, q, state.mixed, state.mixed_normalisers, o, non_finite);
  check_launch("bf16-state outputs kernel");
}

}  // namespace mhla::cuda
