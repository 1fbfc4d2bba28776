#include "cuda/bf16_state_forward.cuh"

#include "cuda/bf16_state_device.cuh"
#include "cuda/bf16_state_mix.cuh"
#include "cuda/cuda_check.hpp"

namespace mhla::cuda {
namespace {

using namespace state;

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
  using Stage = SummariesStage<kColumnFragments>;
  __shared__ __align__(128) SummariesShared<kColumnFragments> shared;

  const int64_t block = blockIdx.x, bh = blockIdx.y;
  const Slice slice = slice_of(p, blockIdx.y);
  const int count = int(p.block_start[block + 1] - p.block_start[block]);
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](Stage& st, int c) {
    stage_block_rows(st.k, k, p, slice, block, c * kKeyChunk, p.dk);
    stage_block_rows(st.v, v, p, slice, block, c * kKeyChunk, p.dv);
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
    add_outer_products(acc, st.k, st.v, p.phi, warp, valid);  // S_b += phi(K)^T V
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
        OperandB<wmma::row_major> b;
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

void bf16_state_summaries(const KernelProblem& p, const uint16_t* k, const uint16_t* v,
                          const Bf16State& state, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads));
  const unsigned threads = unsigned(32 * summaries_warps(p.dk));
  if (column_fragments(p.dv) == 8)
    summaries_kernel<8><<<grid, threads, 0, stream>>>(p, k, v, state.summaries, state.normalisers);
  else
    summaries_kernel<4><<<grid, threads, 0, stream>>>(p, k, v, state.summaries, state.normalisers);
  check_launch("bf16-state summaries kernel");
}

void bf16_state_read_out(const KernelProblem& p, const uint16_t* q, const Bf16State& state,
                         uint16_t* o, int* non_finite, cudaStream_t stream) {
  const unsigned chunks = unsigned(read_chunks(p));
  const dim3 grid(unsigned(p.blocks) * chunks, unsigned(p.batch * p.heads));
  if (column_fragments(p.dv) == 8)
    outputs_kernel<8><<<grid, kReadWarps * 32, 0, stream>>>(
        p, chunks, q, state.mixed, state.mixed_normalisers, o, non_finite);
  else
    outputs_kernel<4><<<grid, kReadWarps * 32, 0, stream>>>(
        p, chunks, q, state.mixed, state.mixed_normalisers, o, non_finite);
  check_launch("bf16-state outputs kernel");
}

void bf16_state_forward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                        const uint16_t* v, const float* w, uint16_t* o, const Bf16State& state,
                        int* non_finite, cudaStream_t stream) {
  bf16_state_summaries(p, k, v, state, stream);
  bf16_state_mix(p, w, false, state.summaries, state.normalisers, state.mixed,
                 state.mixed_normalisers, stream);
  bf16_state_read_out(p, q, state, o, non_finite, stream);
}

}  // namespace mhla::cuda
