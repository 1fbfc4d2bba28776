#include "cuda/bf16_state_forward.cuh"

#include <type_traits>

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
    summaries_kernel(KernelProblem p, const uint16_t* k, const uint16_t* v, uint16_t* s, float* z) {
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
    write_fragment(acc[n], shared.out[warp], [&](const Segment& ls, const float(&x)[kSegment]) {
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
// Token-level causal: the CTA's phi(q) over all of Dk, a chunk of its own
// block's phi(k) and v, and each warp's masked scores.
template <int kColumnFragments>
struct OwnBlockTiles {
  bf16 q[kReadTokens][kMaxDim + kPad];
  bf16 k[kKeyChunk][kMaxDim + kPad];
  bf16 v[kKeyChunk][kColumnFragments * kFrag + kPad];
  bf16 scores[kReadWarps][kFrag][kKeyChunk + kPad];
};
template <int kColumnFragments>
union ReadShared {
  ReadStage<kColumnFragments> stage[kStages];
  FragmentTile out[kReadWarps];  // once the stages are read
};
// Causal, the results' tiles also carry the own block's scores while the
// own block's tiles are in use, so they stand apart from them.
template <int kColumnFragments>
struct CausalReadShared {
  union {
    ReadStage<kColumnFragments> stage[kStages];
    OwnBlockTiles<kColumnFragments> own;
  };
  FragmentTile out[kReadWarps];
};

// acc += phi(Q) S~_i over Dk, kInnerChunk entries a step, and the
// denominators phi(q_t) . z~_i into denominators[t].
template <int kColumnFragments, class Shared>
__device__ void read_mixed(const KernelProblem& p, const int64_t* rows, const uint16_t* q,
                           const uint16_t* state, const float* z, Shared& shared,
                           Accumulator (&acc)[kColumnFragments], float* denominators) {
  constexpr int kQuerySegments = kInnerChunk / kSegment;
  constexpr int kStateSegments = kColumnFragments * kFrag / kSegment;
  using Stage = ReadStage<kColumnFragments>;
  const int warp = int(threadIdx.x / 32);
  const auto stage_chunk = [&](Stage& st, int c) {
    const int64_t a0 = int64_t(c) * kInnerChunk;
    for (int g = threadIdx.x; g < kReadTokens * kQuerySegments; g += blockDim.x) {
      const Segment sg = segment_of<kQuerySegments>(g);
      stage_token_segment(p, &st.q[sg.row][sg.column], q,
                          row_segment(rows[sg.row], a0 + sg.column, p.dk));
    }
    for (int g = threadIdx.x; g < kInnerChunk * kStateSegments; g += blockDim.x) {
      const Segment sg = segment_of<kStateSegments>(g);
      const int64_t a = a0 + sg.row;
      stage_segment(&st.s[sg.row][sg.column], state,
                    row_segment(a < p.dk ? a : -1, sg.column, p.dv));
    }
    commit_copies();
  };

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
}

// Token-level causal: the block's own keys j <= t for the CTA's tokens
// [c0, c0 + kReadTokens), W[i, i] phi(q_t) . phi(k_j) [v_j | 1] added to acc
// (the scores rounded to bfloat16) and to the denominators (in float),
// kKeyChunk keys a step.
template <int kColumnFragments>
__device__ void add_own_block(const KernelProblem& p, const Slice& slice, int64_t block, int c0,
                              float w_ii, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              OwnBlockTiles<kColumnFragments>& own, FragmentTile& out,
                              Accumulator (&acc)[kColumnFragments], float* denominators) {
  const int count = int(p.block_start[block + 1] - p.block_start[block]);
  const int warp = int(threadIdx.x / 32);
  stage_block_rows(own.q, q, p, slice, block, c0, p.dk);
  commit_copies();
  wait_copies<0>();
  __syncthreads();
  map_features(own.q, p);
  float row_part = 0;  // this lane's part of its row's own-block denominator
  const int end = own_keys_end(c0, count);
  for (int j0 = 0; j0 < end; j0 += kKeyChunk) {
    stage_block_rows(own.k, k, p, slice, block, j0, p.dk);
    stage_block_rows(own.v, v, p, slice, block, j0, p.dv);
    commit_copies();
    wait_copies<0>();
    __syncthreads();
    map_features(own.k, p);
    __syncthreads();

    Accumulator scores[kKeyChunk / kFrag];
#pragma unroll
    for (int n = 0; n < kKeyChunk / kFrag; ++n) wmma::fill_fragment(scores[n], 0.0f);
    for (int step = 0; step < p.dk; step += kFrag) {
      OperandA<wmma::row_major> a;  // phi(Q): entry (t, d) at q[t][d]
      wmma::load_matrix_sync(a, &own.q[warp * kFrag][step], kMaxDim + kPad);
#pragma unroll
      for (int n = 0; n < kKeyChunk / kFrag; ++n) {
        OperandB<wmma::col_major> b;  // phi(K)^T: entry (d, j) at k[j][d]
        wmma::load_matrix_sync(b, &own.k[n * kFrag][step], kMaxDim + kPad);
        wmma::mma_sync(scores[n], a, b, scores[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kKeyChunk / kFrag; ++n)
      write_fragment(scores[n], out, [&](const Segment& ls, const float(&x)[kSegment]) {
        const int t = c0 + warp * kFrag + ls.row, j = j0 + n * kFrag + ls.column;
        float y[kSegment];
#pragma unroll
        for (int u = 0; u < kSegment; ++u) {
          y[u] = j + u <= t ? w_ii * x[u] : 0.0f;
          row_part += y[u];
        }
        store_rounded(reinterpret_cast<uint16_t*>(&own.scores[warp][ls.row][n * kFrag + ls.column]),
                      y);
      });
#pragma unroll
    for (int step = 0; step < kKeyChunk; step += kFrag) {
      OperandA<wmma::row_major> a;  // the masked scores: entry (t, j) at scores[t][j]
      wmma::load_matrix_sync(a, &own.scores[warp][0][step], kKeyChunk + kPad);
#pragma unroll
      for (int n = 0; n < kColumnFragments; ++n) {
        OperandB<wmma::row_major> b;
        wmma::load_matrix_sync(b, &own.v[step][n * kFrag], kColumnFragments * kFrag + kPad);
        wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
    __syncthreads();  // k and v are read before the next chunk's copies
  }
  // A row's two lanes (2r, 2r + 1) add their parts, the even lane's first.
  const int lane = int(threadIdx.x % 32);
  const float other = __shfl_xor_sync(0xffffffffu, row_part, 1);
  if (lane % 2 == 0) denominators[warp * kFrag + lane / 2] += row_part + other;
  __syncwarp();
}

// o_t = acc_t / (denominator_t + eps), or scale acc_t, for this warp's 16
// tokens over all of Dv.
template <int kColumnFragments>
__device__ void write_outputs(const KernelProblem& p, const int64_t* rows,
                              const Accumulator (&acc)[kColumnFragments], FragmentTile& out,
                              const float* denominators, uint16_t* o, int* non_finite) {
  const int warp = int(threadIdx.x / 32);
  bool bad = false;
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n)
    write_fragment(acc[n], out, [&](const Segment& ls, const float(&y)[kSegment]) {
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
      bad = !store_tokens(p, o + rows[t] * p.dv + e, r) || bad;
    });
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(non_finite, 1);
}

// One read-out CTA: block i x chunk of kReadTokens tokens, slice bh (the
// grid's). o_t = phi(q_t)^T S~_i / (phi(q_t) . z~_i + eps), or scale
// phi(q_t)^T S~_i, over all of Dv; with token-level causal masking (kCausal)
// S~_i mixes the blocks before i and the block's own keys j <= t enter
// through add_own_block.
template <int kColumnFragments, bool kCausal>
__device__ void read_out(const KernelProblem& p, unsigned chunks, const uint16_t* q,
                         const uint16_t* k, const uint16_t* v, const float* w,
                         const uint16_t* mixed, const float* mixed_z, uint16_t* o,
                         int* non_finite) {
  using Shared =
      std::conditional_t<kCausal, CausalReadShared<kColumnFragments>, ReadShared<kColumnFragments>>;
  __shared__ __align__(128) Shared shared;
  __shared__ int64_t rows[kReadTokens];
  __shared__ float denominators[kReadTokens];

  const unsigned block32 = blockIdx.x / chunks;
  const int64_t block = block32, bh = blockIdx.y;
  const int c0 = int(blockIdx.x - block32 * chunks) * kReadTokens;
  const Slice slice = slice_of(p, blockIdx.y);
  if (c0 >= p.block_start[block + 1] - p.block_start[block]) return;  // before any barrier
  if (threadIdx.x < kReadTokens)
    rows[threadIdx.x] = block_token_row(p, slice, block, c0 + threadIdx.x);
  __syncthreads();

  Accumulator acc[kColumnFragments];
  read_mixed(p, rows, q, mixed + state_offset(p, bh, block),
             mixed_z + normaliser_offset(p, bh, block), shared, acc, denominators);
  const int warp = int(threadIdx.x / 32);
  if constexpr (kCausal)
    add_own_block(p, slice, block, c0, weight(p, w, slice.head, block, block), q, k, v, shared.own,
                  shared.out[warp], acc, denominators);
  write_outputs(p, rows, acc, shared.out[warp], denominators, o, non_finite);
}

template <int kColumnFragments>
__global__ void __launch_bounds__(kReadWarps * 32)
    outputs_kernel(KernelProblem p, unsigned chunks, const uint16_t* q, const uint16_t* mixed,
                   const float* mixed_z, uint16_t* o, int* non_finite) {
  read_out<kColumnFragments, false>(p, chunks, q, nullptr, nullptr, nullptr, mixed, mixed_z, o,
                                    non_finite);
}

// Four CTAs an SM: the kernels' budget of 128 registers a thread.
template <int kColumnFragments>
__global__ void __launch_bounds__(kReadWarps * 32, 4)
    causal_outputs_kernel(KernelProblem p, unsigned chunks, const uint16_t* q, const uint16_t* k,
                          const uint16_t* v, const float* w, const uint16_t* mixed,
                          const float* mixed_z, uint16_t* o, int* non_finite) {
  read_out<kColumnFragments, true>(p, chunks, q, k, v, w, mixed, mixed_z, o, non_finite);
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

void bf16_state_read_out(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                         const uint16_t* v, const float* w, const Bf16State& state, uint16_t* o,
                         int* non_finite, cudaStream_t stream) {
  const unsigned chunks = unsigned(read_chunks(p));
  const dim3 grid(unsigned(p.blocks) * chunks, unsigned(p.batch * p.heads));
  const unsigned threads = kReadWarps * 32;
  const uint16_t* mixed = state.mixed;
  const float* mixed_z = state.mixed_normalisers;
  const bool wide = column_fragments(p.dv) == 8;
  if (p.causal && wide)
    causal_outputs_kernel<8>
        <<<grid, threads, 0, stream>>>(p, chunks, q, k, v, w, mixed, mixed_z, o, non_finite);
  else if (p.causal)
    causal_outputs_kernel<4>
        <<<grid, threads, 0, stream>>>(p, chunks, q, k, v, w, mixed, mixed_z, o, non_finite);
  else if (wide)
    outputs_kernel<8><<<grid, threads, 0, stream>>>(p, chunks, q, mixed, mixed_z, o, non_finite);
  else
    outputs_kernel<4><<<grid, threads, 0, stream>>>(p, chunks, q, mixed, mixed_z, o, non_finite);
  check_launch("bf16-state outputs kernel");
}

void bf16_state_forward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                        const uint16_t* v, const float* w, uint16_t* o, const Bf16State& state,
                        int* non_finite, cudaStream_t stream) {
  bf16_state_summaries(p, k, v, state, stream);
  bf16_state_mix(p, w, false, state.summaries, state.normalisers, state.mixed,
                 state.mixed_normalisers, stream);
  bf16_state_read_out(p, q, k, v, w, state, o, non_finite, stream);
}

}  // namespace mhla::cuda
