#include "cuda/bf16_state_backward.cuh"

#include <algorithm>
#include <type_traits>

#include "cuda/bf16_state_device.cuh"
#include "cuda/bf16_state_mix.cuh"
#include "cuda/cuda_check.hpp"

namespace mhla::cuda {
namespace {

using namespace state;

template <int kColumnFragments>
struct QueryStage {
  alignas(32) bf16 q[kGradChunk][kMaxDim + kPad];
  alignas(32) bf16 g[kGradChunk][kColumnFragments * kFrag + kPad];  // grad_o, then dY
};
template <int kColumnFragments>
union QueryBuffers {
  QueryStage<kColumnFragments> stage[kStages];
  FragmentTile out[kMaxDim / kFrag];
};
// Token-level causal: a chunk of the block's own keys (k, v), the chunk's
// masked scores W[i, i] grad_o_t . v_j (j <= t) on their way to u, and each
// token's normalisers z~_i + W[i, i] sum_{j <= t} phi(k_j).
template <int kColumnFragments>
struct OwnKeys {
  alignas(32) bf16 k[kGradChunk][kMaxDim + kPad];
  alignas(32) bf16 v[kGradChunk][kColumnFragments * kFrag + kPad];
  alignas(32) bf16 scores[kGradChunk][kGradChunk + kPad];
  alignas(32) FragmentTile out[kGradChunkFragments * kGradChunkFragments];
  alignas(32) float z[kGradChunk][kMaxDim + kOutPad];
};
struct NoOwnKeys {};
template <int kColumnFragments, bool kCausal>
struct QueryShared {
  alignas(32) bf16 mixed[kMaxDim][kColumnFragments * kFrag + kPad];  // S~_i
  alignas(32) QueryBuffers<kColumnFragments> buffers;
  alignas(32) float u[kGradChunk][kMaxDim + kOutPad];  // S~_i grad_o_t, a row per token
  float z[kMaxDim];                                    // z~_i
  float inverse[kGradChunk], dden[kGradChunk];         // 1 / (den_t + eps), grad den_t
  std::conditional_t<kCausal, OwnKeys<kColumnFragments>, NoOwnKeys> own;
};

// Token-level causal, the own block's part of a query chunk [c0, c0 + valid)
// (chunk c of the block): with G the chunk's grad_o rows,
//   u_t += W[i, i] sum_{j <= t} (grad_o_t . v_j) phi(k_j)
// (the scores G V^T masked and rounded to bfloat16, then against phi(K)), a
// chunk of keys a step; and own.z[t] = z~_i + W[i, i] sum_{j <= t} phi(k_j)
// in float, `running` (thread d's sum of phi(k_j)[d] over the chunks before)
// carried from chunk to chunk. Then the query side's den_t = phi(q_t) . z_t
// and grad phi(q_t) = u_t / (den_t + eps) + grad den_t z_t hold as they are.
template <int kColumnFragments, class Stage>
__device__ void add_own_keys(const KernelProblem& p, const Slice& slice, int64_t block, int c,
                             int valid, float w_ii, const uint16_t* k, const uint16_t* v,
                             const Stage& st, QueryShared<kColumnFragments, true>& shared,
                             float& running) {
  constexpr int kWidth = kColumnFragments * kFrag;
  OwnKeys<kColumnFragments>& own = shared.own;
  const int warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  const int c0 = c * kGradChunk;
  for (int kc = 0; kc <= c; ++kc) {
    stage_block_rows(own.k, k, p, slice, block, kc * kGradChunk, p.dk);
    stage_block_rows(own.v, v, p, slice, block, kc * kGradChunk, p.dv);
    commit_copies();
    wait_copies<0>();
    __syncthreads();
    // The scores: fragment f, tokens [16 (f / 2), +16) against keys [16 (f % 2), +16).
    for (int f = warp; f < kGradChunkFragments * kGradChunkFragments; f += warps) {
      const int r = f / kGradChunkFragments, n = f % kGradChunkFragments;
      Accumulator acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int s = 0; s < kColumnFragments; ++s) {
        OperandA<wmma::row_major> a;  // grad_o: entry (t, e) at g[t][e]
        wmma::load_matrix_sync(a, &st.g[r * kFrag][s * kFrag], kWidth + kPad);
        OperandB<wmma::col_major> b;  // V^T: entry (e, j) at v[j][e]
        wmma::load_matrix_sync(b, &own.v[n * kFrag][s * kFrag], kWidth + kPad);
        wmma::mma_sync(acc, a, b, acc);
      }
      write_fragment(acc, own.out[f], [&](const Segment& ls, const float (&x)[kSegment]) {
        const int t = c0 + r * kFrag + ls.row, j = kc * kGradChunk + n * kFrag + ls.column;
        float y[kSegment];
#pragma unroll
        for (int u = 0; u < kSegment; ++u) y[u] = j + u <= t ? w_ii * x[u] : 0.0f;
        store_rounded(reinterpret_cast<uint16_t*>(&own.scores[r * kFrag + ls.row][n * kFrag + ls.column]), y);
      });
    }
    __syncthreads();
    // u += scores phi(K): this warp's 16 columns of Dk.
#pragma unroll
    for (int r = 0; r < kGradChunkFragments; ++r) {
      if (r * kFrag >= valid) break;
      Accumulator acc;
      wmma::load_matrix_sync(acc, &shared.u[r * kFrag][warp * kFrag], kMaxDim + kOutPad,
                             wmma::mem_row_major);
#pragma unroll
      for (int step = 0; step < kGradChunk; step += kFrag) {
        OperandA<wmma::row_major> a;
        wmma::load_matrix_sync(a, &own.scores[r * kFrag][step], kGradChunk + kPad);
        OperandB<wmma::row_major> b;  // phi(K): entry (j, d) at k[j][d]
        wmma::load_matrix_sync(b, &own.k[step][warp * kFrag], kMaxDim + kPad);
        apply_feature(p.phi, b);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&shared.u[r * kFrag][warp * kFrag], acc, kMaxDim + kOutPad,
                              wmma::mem_row_major);
    }
    if (kc == c && threadIdx.x < p.dk) {  // the chunk's own tokens: the normalisers' prefix
      const int d = int(threadIdx.x);
      for (int t = 0; t < valid; ++t) {
        running += feature(p.phi, __bfloat162float(own.k[t][d]));
        own.z[t][d] = shared.z[d] + w_ii * running;
      }
    }
    __syncthreads();  // k, v and the scores are read before the next chunk's copies
  }
}

// Grid (block i, slice bh), warp w on rows [16 w, 16 w + 16) of Dk, kGradChunk
// tokens a step. With u_t = S~_i grad_o_t, den_t = phi(q_t) . z~_i:
//   grad den_t = -phi(q_t) . u_t / (den_t + eps)^2,
//   grad phi(q_t) = u_t / (den_t + eps) + grad den_t z~_i   (scale u_t unnormalised),
//   grad S~_i = sum_t phi(q_t) (grad_o_t / (den_t + eps))^T,  grad z~_i = sum_t phi(q_t) grad den_t;
// grad S~_i is summed over the block in float and written as bfloat16 rows.
// Token-level causal (kCausal): S~_i mixes the blocks before i, and
// add_own_keys adds the own block's keys j <= t to u_t and z~_i; the tokens'
// 1 / (den_t + eps) (scale unnormalised) and grad den_t go to `terms` for the
// key and value side.
template <int kColumnFragments, bool kCausal>
__global__ void __launch_bounds__(kMaxDim / kFrag * 32)
    query_side_kernel(KernelProblem p, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      const float* w, const uint16_t* grad_o, const uint16_t* mixed,
                      const float* mixed_z, uint16_t* grad_q, uint16_t* grad_mixed,
                      float* grad_mixed_z, float* terms, int* non_finite) {
  constexpr int kWidth = kColumnFragments * kFrag;
  constexpr int kQuerySegments = kMaxDim / kSegment, kGradSegments = kWidth / kSegment;
  using Stage = QueryStage<kColumnFragments>;
  auto& shared = dynamic_shared<QueryShared<kColumnFragments, kCausal>>();

  const int64_t block = blockIdx.x, bh = blockIdx.y;
  const Slice slice = slice_of(p, blockIdx.y);
  const int count = int(p.block_start[block + 1] - p.block_start[block]);
  const int warp = int(threadIdx.x / 32), rows = summaries_warps(p.dk) * kFrag;
  stage_state_rows(shared.mixed, mixed + state_offset(p, bh, block), p, rows);
  commit_copies();
  if (threadIdx.x < p.dk) shared.z[threadIdx.x] = mixed_z[normaliser_offset(p, bh, block) + threadIdx.x];

  const auto stage_chunk = [&](Stage& st, int c) {
    stage_block_rows(st.q, q, p, slice, block, c * kGradChunk, p.dk);
    stage_block_rows(st.g, grad_o, p, slice, block, c * kGradChunk, p.dv);
    commit_copies();
  };

  Accumulator acc[kColumnFragments];  // grad S~_i, rows [16 w, 16 w + 16)
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n) wmma::fill_fragment(acc[n], 0.0f);
  float grad_z = 0;  // grad z~_i's entry threadIdx.x
  float running = 0;  // causal: the sum of phi(k_j)'s entry threadIdx.x over the chunks before
  const float w_ii = kCausal ? weight(p, w, slice.head, block, block) : 0.0f;
  bool bad = false;
  const int t = int(threadIdx.x);
  pipelined(shared.buffers.stage, int(ceil_div(count, kGradChunk)), stage_chunk, [&](Stage& st, int c) {
    const int c0 = c * kGradChunk, valid = count - c0 < kGradChunk ? count - c0 : kGradChunk;
    // u = grad_o S~_i^T: this warp's 16 columns of Dk, every token of the chunk.
#pragma unroll
    for (int r = 0; r < kGradChunkFragments; ++r) {
      if (r * kFrag >= valid) break;
      Accumulator u;
      wmma::fill_fragment(u, 0.0f);
#pragma unroll
      for (int n = 0; n < kColumnFragments; ++n) {
        OperandA<wmma::row_major> a;
        wmma::load_matrix_sync(a, &st.g[r * kFrag][n * kFrag], kWidth + kPad);
        OperandB<wmma::col_major> b;  // S~_i^T: entry (e, d) at mixed[d][e]
        wmma::load_matrix_sync(b, &shared.mixed[warp * kFrag][n * kFrag], kWidth + kPad);
        wmma::mma_sync(u, a, b, u);
      }
      wmma::store_matrix_sync(&shared.u[r * kFrag][warp * kFrag], u, kMaxDim + kOutPad,
                              wmma::mem_row_major);
    }
    __syncthreads();
    // The normalisers token t reads: z~_i, or causal its own row.
    const auto z_of = [&](int token, int a) -> float {
      if constexpr (kCausal)
        return shared.own.z[token][a];
      else
        return shared.z[a];
    };
    if constexpr (kCausal) add_own_keys(p, slice, block, c, valid, w_ii, k, v, st, shared, running);
    // Per token, phi(q_t) once: den_t = phi(q_t) . z~_i and phi(q_t) . u_t in one pass.
    if (p.normalize && t < valid) {
      float den = 0, dot = 0;
      for (int a = 0; a < p.dk; ++a) {
        const float x = feature(p.phi, __bfloat162float(st.q[t][a]));
        den += x * z_of(t, a);
        dot += x * shared.u[t][a];
      }
      const float inverse = 1.0f / (den + float(p.eps));
      shared.inverse[t] = inverse;
      shared.dden[t] = -dot * inverse * inverse;
    }
    if (kCausal && t < valid) {
      float* to = terms + 2 * block_token_row(p, slice, block, c0 + t);
      to[0] = p.normalize ? shared.inverse[t] : float(p.scale);
      to[1] = p.normalize ? shared.dden[t] : 0.0f;
    }
    __syncthreads();
    for (int g = threadIdx.x; g < kGradChunk * kQuerySegments; g += blockDim.x) {
      const Segment sg = segment_of<kQuerySegments>(g);
      if (sg.row >= valid || sg.column >= p.dk) continue;
      float x[kSegment], r[kSegment];
      load_staged(&st.q[sg.row][sg.column], x);
#pragma unroll
      for (int u = 0; u < kSegment; ++u) {
        const float du = shared.u[sg.row][sg.column + u];
        const float grad_phi = p.normalize ? du * shared.inverse[sg.row] +
                                                 shared.dden[sg.row] * z_of(sg.row, sg.column + u)
                                           : float(p.scale) * du;
        r[u] = grad_phi * feature_derivative(p.phi, x[u]);
        bad = bad || !isfinite(r[u]);
      }
      bad = !store_tokens(
                p, grad_q + block_token_row(p, slice, block, c0 + sg.row) * p.dk + sg.column, r) ||
            bad;
    }
    if (p.normalize) {
      if (t < p.dk)
        for (int j = 0; j < valid; ++j)
          grad_z += feature(p.phi, __bfloat162float(st.q[j][t])) * shared.dden[j];
      // dY = grad_o / (den + eps), in place (rows past the block stay zero).
      for (int g = threadIdx.x; g < kGradChunk * kGradSegments; g += blockDim.x) {
        const Segment sg = segment_of<kGradSegments>(g);
        if (sg.row >= valid) continue;
        float x[kSegment];
        load_staged(&st.g[sg.row][sg.column], x);
#pragma unroll
        for (int u = 0; u < kSegment; ++u) x[u] *= shared.inverse[sg.row];
        store_rounded(reinterpret_cast<uint16_t*>(&st.g[sg.row][sg.column]), x);
      }
    }
    __syncthreads();
    add_outer_products(acc, st.q, st.g, p.phi, warp, valid);  // grad S~_i += phi(Q)^T dY
  });

  uint16_t* to = grad_mixed + state_offset(p, bh, block);
  const float scale = p.normalize ? 1.0f : float(p.scale);
#pragma unroll
  for (int n = 0; n < kColumnFragments; ++n)
    write_fragment(acc[n], shared.buffers.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
      const int64_t d = warp * kFrag + ls.row, e = n * kFrag + ls.column;
      if (d >= p.dk || e >= p.dv) return;
      float r[kSegment];
#pragma unroll
      for (int u = 0; u < kSegment; ++u) r[u] = scale * x[u];
      store_rounded(to + d * p.dv + e, r);
    });
  if (t < p.dk) grad_mixed_z[normaliser_offset(p, bh, block) + t] = grad_z;
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(non_finite, 1);
}

template <int kColumnFragments>
struct KeyValueStage {
  alignas(32) bf16 k[kGradChunk][kMaxDim + kPad];
  alignas(32) bf16 v[kGradChunk][kColumnFragments * kFrag + kPad];
};
// Token-level causal: a chunk of the block's own queries (phi(q) mapped in
// place, grad_o, and their terms from the query side), the chunk's masked
// score tiles, and the key chunk's own-block gradients summed over them.
template <int kColumnFragments>
struct OwnQueries {
  alignas(32) bf16 q[kGradChunk][kMaxDim + kPad];
  alignas(32) bf16 g[kGradChunk][kColumnFragments * kFrag + kPad];
  alignas(32) bf16 grad_scores[kGradChunk][kGradChunk + kPad];  // dA_jt, key rows
  alignas(32) bf16 scores[kGradChunk][kGradChunk + kPad];       // W[i, i] A_jt m_t, key rows
  alignas(32) float grad_k[kGradChunk][kMaxDim + kOutPad];
  alignas(32) float grad_v[kGradChunk][kColumnFragments * kFrag + kOutPad];
  float m[kGradChunk], dden[kGradChunk];
  float weight_parts[kKeyValueWarps * 32];
};
struct NoOwnQueries {};
template <int kColumnFragments, bool kCausal>
struct KeyValueShared {
  alignas(32) bf16 grad_s[kMaxDim][kColumnFragments * kFrag + kPad];  // grad S_b
  alignas(32) KeyValueStage<kColumnFragments> stage[kStages];
  alignas(32) FragmentTile out[kKeyValueWarps];
  float grad_z[kMaxDim];  // grad z_b
  std::conditional_t<kCausal, OwnQueries<kColumnFragments>, NoOwnQueries> own;
};

// Token-level causal, the own block's part of key chunk c's gradients (keys
// [c0, c0 + kGradChunk)), over the query chunks from c on: with A_jt =
// phi(k_j) . phi(q_t), m_t and grad den_t from the query side (terms) and
// dA_jt = W[i, i] (m_t grad_o_t . v_j + grad den_t) for t >= j,
//   grad phi(k_j) += sum_t dA_jt phi(q_t),  grad v_j += sum_t W[i, i] A_jt m_t grad_o_t,
// into own.grad_k and own.grad_v (float), and this thread's part of W[i, i]'s
// gradient, sum A_jt (m_t grad_o_t . v_j + grad den_t), into weight_part.
template <int kColumnFragments, class Stage>
__device__ void add_own_queries(const KernelProblem& p, const Slice& slice, int64_t block, int c,
                                int count, float w_ii, const uint16_t* q, const uint16_t* grad_o,
                                const float* terms, const Stage& st,
                                KeyValueShared<kColumnFragments, true>& shared, float& weight_part) {
  constexpr int kWidth = kColumnFragments * kFrag;
  OwnQueries<kColumnFragments>& own = shared.own;
  const int warp = int(threadIdx.x / 32), key_fragments = summaries_warps(p.dk);
  const int c0 = c * kGradChunk;
  for (int g = threadIdx.x; g < kGradChunk * (kMaxDim + kOutPad); g += blockDim.x)
    own.grad_k[g / (kMaxDim + kOutPad)][g % (kMaxDim + kOutPad)] = 0.0f;
  for (int g = threadIdx.x; g < kGradChunk * (kWidth + kOutPad); g += blockDim.x)
    own.grad_v[g / (kWidth + kOutPad)][g % (kWidth + kOutPad)] = 0.0f;
  for (int t0 = c0; t0 < count; t0 += kGradChunk) {
    stage_block_rows(own.q, q, p, slice, block, t0, p.dk);
    stage_block_rows(own.g, grad_o, p, slice, block, t0, p.dv);
    commit_copies();
    if (threadIdx.x < kGradChunk) {
      const int64_t row = block_token_row(p, slice, block, t0 + threadIdx.x);
      own.m[threadIdx.x] = row >= 0 ? terms[2 * row] : 0.0f;
      own.dden[threadIdx.x] = row >= 0 ? terms[2 * row + 1] : 0.0f;
    }
    wait_copies<0>();
    __syncthreads();
    map_features(own.q, p);
    __syncthreads();
    // Fragment f: keys [16 (f / 2), +16) against queries [16 (f % 2), +16),
    // A (phi(K) phi(Q)^T) and grad_o . v (V G^T) side by side.
    if (warp < kGradChunkFragments * kGradChunkFragments) {
      const int f = warp, r = f / kGradChunkFragments, n = f % kGradChunkFragments;
      Accumulator scores, dots;
      wmma::fill_fragment(scores, 0.0f);
      wmma::fill_fragment(dots, 0.0f);
      for (int s = 0; s < key_fragments; ++s) {
        OperandA<wmma::row_major> a;  // phi(K), in registers
        wmma::load_matrix_sync(a, &st.k[r * kFrag][s * kFrag], kMaxDim + kPad);
        apply_feature(p.phi, a);
        OperandB<wmma::col_major> b;  // phi(Q)^T: entry (d, t) at q[t][d], mapped in place
        wmma::load_matrix_sync(b, &own.q[n * kFrag][s * kFrag], kMaxDim + kPad);
        wmma::mma_sync(scores, a, b, scores);
      }
#pragma unroll
      for (int s = 0; s < kColumnFragments; ++s) {
        OperandA<wmma::row_major> a;  // V
        wmma::load_matrix_sync(a, &st.v[r * kFrag][s * kFrag], kWidth + kPad);
        OperandB<wmma::col_major> b;  // G^T: entry (e, t) at g[t][e]
        wmma::load_matrix_sync(b, &own.g[n * kFrag][s * kFrag], kWidth + kPad);
        wmma::mma_sync(dots, a, b, dots);
      }
      float a_values[kSegment];
      write_fragment(scores, shared.out[warp], [&](const Segment&, const float (&x)[kSegment]) {
#pragma unroll
        for (int u = 0; u < kSegment; ++u) a_values[u] = x[u];
      });
      write_fragment(dots, shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
        const int j = c0 + r * kFrag + ls.row, tl = n * kFrag + ls.column;
        float grad_scores[kSegment], scaled[kSegment];
#pragma unroll
        for (int u = 0; u < kSegment; ++u) {
          const bool seen = t0 + tl + u >= j && t0 + tl + u < count;
          const float m = own.m[tl + u], pull = m * x[u] + own.dden[tl + u];
          grad_scores[u] = seen ? w_ii * pull : 0.0f;
          scaled[u] = seen ? w_ii * a_values[u] * m : 0.0f;
          weight_part += seen ? a_values[u] * pull : 0.0f;
        }
        store_rounded(reinterpret_cast<uint16_t*>(&own.grad_scores[r * kFrag + ls.row][tl]), grad_scores);
        store_rounded(reinterpret_cast<uint16_t*>(&own.scores[r * kFrag + ls.row][tl]), scaled);
      });
    }
    __syncthreads();
    // grad_k += dA phi(Q) and grad_v += scores G: fragments (key rows r,
    // 16 columns n), grad_k's first, shared among the warps.
    const int key_total = kGradChunkFragments * key_fragments;
    const int total = key_total + kGradChunkFragments * kColumnFragments;
    for (int f = warp; f < total; f += kKeyValueWarps) {
      const bool key = f < key_total;
      const int local = key ? f : f - key_total, across = key ? key_fragments : kColumnFragments;
      const int r = local / across, n = local - r * across;
      float* sum = key ? &own.grad_k[r * kFrag][n * kFrag] : &own.grad_v[r * kFrag][n * kFrag];
      const int ldm = key ? kMaxDim + kOutPad : kWidth + kOutPad;
      Accumulator acc;
      wmma::load_matrix_sync(acc, sum, ldm, wmma::mem_row_major);
#pragma unroll
      for (int step = 0; step < kGradChunk; step += kFrag) {
        OperandA<wmma::row_major> a;
        wmma::load_matrix_sync(a, key ? &own.grad_scores[r * kFrag][step] : &own.scores[r * kFrag][step],
                               kGradChunk + kPad);
        OperandB<wmma::row_major> b;  // phi(Q) (mapped) or G: entry (t, column) at [t][column]
        if (key)
          wmma::load_matrix_sync(b, &own.q[step][n * kFrag], kMaxDim + kPad);
        else
          wmma::load_matrix_sync(b, &own.g[step][n * kFrag], kWidth + kPad);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sum, acc, ldm, wmma::mem_row_major);
    }
    __syncthreads();  // the chunk's tiles are read before the next chunk's copies
  }
}

// Grid (block b, slice bh), kKeyValueWarps warps sharing each chunk's result
// fragments: grad_k_j = (grad S_b v_j + grad z_b) * phi'(k_j) and
// grad_v_j = grad S_b^T phi(k_j), kGradChunk tokens a step.
// Token-level causal (kCausal): add_own_queries adds the own block's queries
// t >= j to each key chunk's gradients before they are written, and the
// CTA's part of W[i, i]'s gradient goes to diagonal[bh, i], its threads'
// parts added in order.
template <int kColumnFragments, bool kCausal>
__global__ void __launch_bounds__(kKeyValueWarps * 32)
    key_value_side_kernel(KernelProblem p, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                          const float* w, const uint16_t* grad_o, const uint16_t* grad_s,
                          const float* grad_z, const float* terms, uint16_t* grad_k,
                          uint16_t* grad_v, float* diagonal, int* non_finite) {
  constexpr int kWidth = kColumnFragments * kFrag;
  using Stage = KeyValueStage<kColumnFragments>;
  auto& shared = dynamic_shared<KeyValueShared<kColumnFragments, kCausal>>();

  const int64_t block = blockIdx.x, bh = blockIdx.y;
  const Slice slice = slice_of(p, blockIdx.y);
  const int count = int(p.block_start[block + 1] - p.block_start[block]);
  const int warp = int(threadIdx.x / 32), key_fragments = summaries_warps(p.dk);
  stage_state_rows(shared.grad_s, grad_s + state_offset(p, bh, block), p, key_fragments * kFrag);
  commit_copies();
  if (threadIdx.x < p.dk) shared.grad_z[threadIdx.x] = grad_z[normaliser_offset(p, bh, block) + threadIdx.x];

  const auto stage_chunk = [&](Stage& st, int c) {
    stage_block_rows(st.k, k, p, slice, block, c * kGradChunk, p.dk);
    stage_block_rows(st.v, v, p, slice, block, c * kGradChunk, p.dv);
    commit_copies();
  };

  bool bad = false;
  float weight_part = 0;  // causal: this thread's part of W[i, i]'s gradient
  const float w_ii = kCausal ? weight(p, w, slice.head, block, block) : 0.0f;
  // The chunk's fragments: grad_k's (token rows r, 16 columns n of Dk) first,
  // then grad_v's (r, 16 columns n of Dv).
  const int key_total = kGradChunkFragments * key_fragments;
  const int total = key_total + kGradChunkFragments * kColumnFragments;
  pipelined(shared.stage, int(ceil_div(count, kGradChunk)), stage_chunk, [&](const Stage& st, int c) {
    const int c0 = c * kGradChunk, valid = count - c0 < kGradChunk ? count - c0 : kGradChunk;
    if constexpr (kCausal)
      add_own_queries(p, slice, block, c, count, w_ii, q, grad_o, terms, st, shared, weight_part);
    // The own block's part of key j's gradient entry (j, column), causal.
    const auto own_part = [&](bool key, int j, int column) -> float {
      if constexpr (kCausal)
        return key ? shared.own.grad_k[j][column] : shared.own.grad_v[j][column];
      else
        return 0.0f;
    };
    for (int f = warp; f < total; f += kKeyValueWarps) {
      const bool key = f < key_total;
      const int local = key ? f : f - key_total, across = key ? key_fragments : kColumnFragments;
      const int r = local / across, n = local - r * across;
      if (r * kFrag >= valid) continue;
      Accumulator acc;
      wmma::fill_fragment(acc, 0.0f);
      if (key) {
        for (int s = 0; s < kColumnFragments; ++s) {
          OperandA<wmma::row_major> a;
          wmma::load_matrix_sync(a, &st.v[r * kFrag][s * kFrag], kWidth + kPad);
          OperandB<wmma::col_major> b;  // grad S_b^T: entry (e, d) at grad_s[d][e]
          wmma::load_matrix_sync(b, &shared.grad_s[n * kFrag][s * kFrag], kWidth + kPad);
          wmma::mma_sync(acc, a, b, acc);
        }
      } else {
        for (int s = 0; s < key_fragments; ++s) {
          OperandA<wmma::row_major> a;
          wmma::load_matrix_sync(a, &st.k[r * kFrag][s * kFrag], kMaxDim + kPad);
          apply_feature(p.phi, a);
          OperandB<wmma::row_major> b;
          wmma::load_matrix_sync(b, &shared.grad_s[s * kFrag][n * kFrag], kWidth + kPad);
          wmma::mma_sync(acc, a, b, acc);
        }
      }
      write_fragment(acc, shared.out[warp], [&](const Segment& ls, const float (&x)[kSegment]) {
        const int j = r * kFrag + ls.row, column = n * kFrag + ls.column;
        if (j >= valid || column >= (key ? p.dk : p.dv)) return;
        const int64_t row = block_token_row(p, slice, block, c0 + j);
        float out[kSegment];
        if (key) {
          float kx[kSegment];
          load_staged(&st.k[j][column], kx);
#pragma unroll
          for (int u = 0; u < kSegment; ++u)
            out[u] = (x[u] + shared.grad_z[column + u] + own_part(true, j, column + u)) *
                     feature_derivative(p.phi, kx[u]);
        } else {
#pragma unroll
          for (int u = 0; u < kSegment; ++u) out[u] = x[u] + own_part(false, j, column + u);
        }
#pragma unroll
        for (int u = 0; u < kSegment; ++u) bad = bad || !isfinite(out[u]);
        bad = !store_tokens(p, key ? grad_k + row * p.dk + column : grad_v + row * p.dv + column,
                            out) ||
              bad;
      });
    }
  });
  if constexpr (kCausal) {
    shared.own.weight_parts[threadIdx.x] = weight_part;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0;
      for (int x = 0; x < kKeyValueWarps * 32; ++x) sum += shared.own.weight_parts[x];
      diagonal[blockIdx.y * p.blocks + block] = sum;
    }
  }
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(non_finite, 1);
}

// What one CTA stages must fit an SM's shared memory (227 KB on sm_90, 163 KB
// on sm_80), two CTAs of each side an SM on sm_90; causal, one on sm_80 and
// sm_90 with the wider CTA, two with the narrower.
static_assert(sizeof(QueryShared<8, false>) <= 113 * 1024 &&
              sizeof(KeyValueShared<8, false>) <= 113 * 1024);
static_assert(sizeof(QueryShared<8, true>) <= 163 * 1024 &&
              sizeof(KeyValueShared<8, true>) <= 163 * 1024);
static_assert(sizeof(QueryShared<4, true>) <= 113 * 1024 &&
              sizeof(KeyValueShared<4, true>) <= 113 * 1024);

bool aligned(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

// A kernel with `Shared` as its dynamic shared memory, launched on `grid`.
template <class Shared, class Kernel, class... Args>
void launch_with_shared(Kernel kernel, dim3 grid, unsigned threads, cudaStream_t stream,
                        const char* name, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(sizeof(Shared))),
        "cudaFuncSetAttribute (dynamic shared memory)");
  kernel<<<grid, threads, sizeof(Shared), stream>>>(args...);
  check_launch(name);
}

}  // namespace

namespace {

template <int kColumnFragments, bool kCausal>
constexpr int64_t shared_bytes() {
  return int64_t(std::max(sizeof(QueryShared<kColumnFragments, kCausal>),
                          sizeof(KeyValueShared<kColumnFragments, kCausal>)));
}

// The current device's opt-in limit on one CTA's shared memory.
int64_t device_shared_limit() {
  int device = 0, bytes = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute (opt-in shared memory per block)");
  return bytes;
}

}  // namespace

int64_t bf16_state_backward_shared_bytes(const KernelProblem& p) {
  if (column_fragments(p.dv) == 8) return p.causal ? shared_bytes<8, true>() : shared_bytes<8, false>();
  return p.causal ? shared_bytes<4, true>() : shared_bytes<4, false>();
}

bool bf16_state_backward_fits(const KernelProblem& p, const void* q, const void* k, const void* v,
                              const void* grad_o, const void* grad_q, const void* grad_k,
                              const void* grad_v) {
  return state::fits(p) && aligned(q) && aligned(k) && aligned(v) && aligned(grad_o) &&
         aligned(grad_q) && aligned(grad_k) && aligned(grad_v) &&
         bf16_state_backward_shared_bytes(p) <= device_shared_limit();
}

// The scratch: the weight gradient's, then (causal) the tokens' terms [B N H,
// 2] and the own blocks' part of W's diagonal gradient [B H, M].
int64_t bf16_state_backward_scratch(const KernelProblem& p) {
  const int64_t causal = p.causal ? 2 * p.batch * p.tokens * p.heads + p.batch * p.heads * p.blocks : 0;
  return bf16_state_weight_scratch(p) + causal;
}

namespace {

template <int kColumnFragments, bool kCausal>
void launch_query_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                       const uint16_t* v, const float* w, const uint16_t* grad_o,
                       const Bf16State& state, const Bf16State& grads, uint16_t* grad_q,
                       float* terms, int* non_finite, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads));
  const unsigned threads = unsigned(32 * summaries_warps(p.dk));
  launch_with_shared<QueryShared<kColumnFragments, kCausal>>(
      query_side_kernel<kColumnFragments, kCausal>, grid, threads, stream,
      "bf16-state query side kernel", p, q, k, v, w, grad_o,
      static_cast<const uint16_t*>(state.mixed), static_cast<const float*>(state.mixed_normalisers),
      grad_q, grads.mixed, grads.mixed_normalisers, terms, non_finite);
}

template <int kColumnFragments, bool kCausal>
void launch_key_value_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const float* w, const uint16_t* grad_o,
                           const Bf16State& grads, const float* terms, uint16_t* grad_k,
                           uint16_t* grad_v, float* diagonal, int* non_finite,
                           cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads));
  launch_with_shared<KeyValueShared<kColumnFragments, kCausal>>(
      key_value_side_kernel<kColumnFragments, kCausal>, grid, kKeyValueWarps * 32, stream,
      "bf16-state key and value side kernel", p, q, k, v, w, grad_o,
      static_cast<const uint16_t*>(grads.summaries), static_cast<const float*>(grads.normalisers),
      terms, grad_k, grad_v, diagonal, non_finite);
}

}  // namespace

void bf16_state_query_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const float* w, const uint16_t* grad_o,
                           const Bf16State& state, const Bf16State& grads, uint16_t* grad_q,
                           float* terms, int* non_finite, cudaStream_t stream) {
  const bool wide = column_fragments(p.dv) == 8;
  const auto launch = wide ? (p.causal ? launch_query_side<8, true> : launch_query_side<8, false>)
                           : (p.causal ? launch_query_side<4, true> : launch_query_side<4, false>);
  launch(p, q, k, v, w, grad_o, state, grads, grad_q, terms, non_finite, stream);
}

void bf16_state_key_value_side(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                               const uint16_t* v, const float* w, const uint16_t* grad_o,
                               const Bf16State& grads, const float* terms, uint16_t* grad_k,
                               uint16_t* grad_v, float* diagonal, int* non_finite,
                               cudaStream_t stream) {
  const bool wide = column_fragments(p.dv) == 8;
  const auto launch =
      wide ? (p.causal ? launch_key_value_side<8, true> : launch_key_value_side<8, false>)
           : (p.causal ? launch_key_value_side<4, true> : launch_key_value_side<4, false>);
  launch(p, q, k, v, w, grad_o, grads, terms, grad_k, grad_v, diagonal, non_finite, stream);
}

void bf16_state_backward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                         const uint16_t* v, const float* w, const uint16_t* grad_o,
                         uint16_t* grad_q, uint16_t* grad_k, uint16_t* grad_v, float* grad_w,
                         const Bf16State& state, const Bf16State& grads, float* scratch,
                         int* non_finite, cudaStream_t stream) {
  float* terms = p.causal ? scratch + bf16_state_weight_scratch(p) : nullptr;
  float* diagonal = p.causal ? terms + 2 * p.batch * p.tokens * p.heads : nullptr;
  bf16_state_summaries(p, k, v, state, stream);
  bf16_state_mix(p, w, false, state.summaries, state.normalisers, state.mixed,
                 state.mixed_normalisers, stream);
  bf16_state_query_side(p, q, k, v, w, grad_o, state, grads, grad_q, terms, non_finite, stream);
  bf16_state_mix(p, w, true, grads.mixed, grads.mixed_normalisers, grads.summaries,
                 grads.normalisers, stream);
  // The key and value side first: causal, it sums W's diagonal part that
  // the weight gradient adds.
  bf16_state_key_value_side(p, q, k, v, w, grad_o, grads, terms, grad_k, grad_v, diagonal,
                            non_finite, stream);
  if (grad_w != nullptr)
    bf16_state_weight_gradient(p, grads.mixed, grads.mixed_normalisers, state.summaries,
                               state.normalisers, diagonal, grad_w, scratch, non_finite, stream);
}

}  // namespace mhla::cuda
