#include "cuda/bf16_state_backward.cuh"

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
template <int kColumnFragments>
struct QueryShared {
  alignas(32) bf16 mixed[kMaxDim][kColumnFragments * kFrag + kPad];  // S~_i
  alignas(32) QueryBuffers<kColumnFragments> buffers;
  alignas(32) float u[kGradChunk][kMaxDim + kOutPad];  // S~_i grad_o_t, a row per token
  float z[kMaxDim];                                    // z~_i
  float inverse[kGradChunk], dden[kGradChunk];         // 1 / (den_t + eps), grad den_t
};

// Grid (block i, slice bh), warp w on rows [16 w, 16 w + 16) of Dk, kGradChunk
// tokens a step. With u_t = S~_i grad_o_t, den_t = phi(q_t) . z~_i:
//   grad den_t = -phi(q_t) . u_t / (den_t + eps)^2,
//   grad phi(q_t) = u_t / (den_t + eps) + grad den_t z~_i   (scale u_t unnormalised),
//   grad S~_i = sum_t phi(q_t) (grad_o_t / (den_t + eps))^T,  grad z~_i = sum_t phi(q_t) grad den_t;
// grad S~_i is summed over the block in float and written as bfloat16 rows.
template <int kColumnFragments>
__global__ void __launch_bounds__(kMaxDim / kFrag * 32)
    query_side_kernel(KernelProblem p, const uint16_t* q, const uint16_t* grad_o,
                      const uint16_t* mixed, const float* mixed_z, uint16_t* grad_q,
                      uint16_t* grad_mixed, float* grad_mixed_z, int* non_finite) {
  constexpr int kWidth = kColumnFragments * kFrag;
  constexpr int kQuerySegments = kMaxDim / kSegment, kGradSegments = kWidth / kSegment;
  using Stage = QueryStage<kColumnFragments>;
  auto& shared = dynamic_shared<QueryShared<kColumnFragments>>();

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
    // Per token, phi(q_t) once: den_t = phi(q_t) . z~_i and phi(q_t) . u_t in one pass.
    if (p.normalize && t < valid) {
      float den = 0, dot = 0;
      for (int a = 0; a < p.dk; ++a) {
        const float x = feature(p.phi, __bfloat162float(st.q[t][a]));
        den += x * shared.z[a];
        dot += x * shared.u[t][a];
      }
      const float inverse = 1.0f / (den + float(p.eps));
      shared.inverse[t] = inverse;
      shared.dden[t] = -dot * inverse * inverse;
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
                                                 shared.dden[sg.row] * shared.z[sg.column + u]
                                           : float(p.scale) * du;
        r[u] = grad_phi * feature_derivative(p.phi, x[u]);
        bad = bad || !isfinite(r[u]);
      }
      store_rounded(grad_q + block_token_row(p, slice, block, c0 + sg.row) * p.dk + sg.column, r);
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
template <int kColumnFragments>
struct KeyValueShared {
  alignas(32) bf16 grad_s[kMaxDim][kColumnFragments * kFrag + kPad];  // grad S_b
  alignas(32) KeyValueStage<kColumnFragments> stage[kStages];
  alignas(32) FragmentTile out[kKeyValueWarps];
  float grad_z[kMaxDim];  // grad z_b
};

// Grid (block b, slice bh), kKeyValueWarps warps sharing each chunk's result
// fragments: grad_k_j = (grad S_b v_j + grad z_b) * phi'(k_j) and
// grad_v_j = grad S_b^T phi(k_j), kGradChunk tokens a step.
template <int kColumnFragments>
__global__ void __launch_bounds__(kKeyValueWarps * 32)
    key_value_side_kernel(KernelProblem p, const uint16_t* k, const uint16_t* v,
                          const uint16_t* grad_s, const float* grad_z, uint16_t* grad_k,
                          uint16_t* grad_v, int* non_finite) {
  constexpr int kWidth = kColumnFragments * kFrag;
  using Stage = KeyValueStage<kColumnFragments>;
  auto& shared = dynamic_shared<KeyValueShared<kColumnFragments>>();

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
  // The chunk's fragments: grad_k's (token rows r, 16 columns n of Dk) first,
  // then grad_v's (r, 16 columns n of Dv).
  const int key_total = kGradChunkFragments * key_fragments;
  const int total = key_total + kGradChunkFragments * kColumnFragments;
  pipelined(shared.stage, int(ceil_div(count, kGradChunk)), stage_chunk, [&](const Stage& st, int c) {
    const int c0 = c * kGradChunk, valid = count - c0 < kGradChunk ? count - c0 : kGradChunk;
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
            out[u] = (x[u] + shared.grad_z[column + u]) * feature_derivative(p.phi, kx[u]);
        } else {
#pragma unroll
          for (int u = 0; u < kSegment; ++u) out[u] = x[u];
        }
#pragma unroll
        for (int u = 0; u < kSegment; ++u) bad = bad || !isfinite(out[u]);
        store_rounded(key ? grad_k + row * p.dk + column : grad_v + row * p.dv + column, out);
      });
    }
  });
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(non_finite, 1);
}

// What one CTA stages must fit an SM's shared memory (227 KB on sm_90, 163 KB
// on sm_80), two CTAs of the query side an SM on sm_90.
static_assert(sizeof(QueryShared<8>) <= 113 * 1024 && sizeof(KeyValueShared<8>) <= 113 * 1024);

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

bool bf16_state_backward_fits(const KernelProblem& p, const void* q, const void* k, const void* v,
                              const void* grad_o, const void* grad_q, const void* grad_k,
                              const void* grad_v) {
  return state::backward_fits(p) && aligned(q) && aligned(k) && aligned(v) && aligned(grad_o) &&
         aligned(grad_q) && aligned(grad_k) && aligned(grad_v);
}

int64_t bf16_state_backward_scratch(const KernelProblem& p) { return bf16_state_weight_scratch(p); }

void bf16_state_query_side(const KernelProblem& p, const uint16_t* q, const uint16_t* grad_o,
                           const Bf16State& state, const Bf16State& grads, uint16_t* grad_q,
                           int* non_finite, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads));
  const unsigned threads = unsigned(32 * summaries_warps(p.dk));
  const char* name = "bf16-state query side kernel";
  const uint16_t* mixed = state.mixed;
  const float* mixed_z = state.mixed_normalisers;
  if (column_fragments(p.dv) == 8)
    launch_with_shared<QueryShared<8>>(query_side_kernel<8>, grid, threads, stream, name, p, q,
                                       grad_o, mixed, mixed_z, grad_q, grads.mixed,
                                       grads.mixed_normalisers, non_finite);
  else
    launch_with_shared<QueryShared<4>>(query_side_kernel<4>, grid, threads, stream, name, p, q,
                                       grad_o, mixed, mixed_z, grad_q, grads.mixed,
                                       grads.mixed_normalisers, non_finite);
}

void bf16_state_key_value_side(const KernelProblem& p, const uint16_t* k, const uint16_t* v,
                               const Bf16State& grads, uint16_t* grad_k, uint16_t* grad_v,
                               int* non_finite, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads));
  const char* name = "bf16-state key and value side kernel";
  const uint16_t* grad_s = grads.summaries;
  const float* grad_z = grads.normalisers;
  if (column_fragments(p.dv) == 8)
    launch_with_shared<KeyValueShared<8>>(key_value_side_kernel<8>, grid, kKeyValueWarps * 32,
                                          stream, name, p, k, v, grad_s, grad_z, grad_k, grad_v,
                                          non_finite);
  else
    launch_with_shared<KeyValueShared<4>>(key_value_side_kernel<4>, grid, kKeyValueWarps * 32,
                                          stream, name, p, k, v, grad_s, grad_z, grad_k, grad_v,
                                          non_finite);
}

void bf16_state_backward(const KernelProblem& p, const uint16_t* q, const uint16_t* k,
                         const uint16_t* v, const float* w, const uint16_t* grad_o,
                         uint16_t* grad_q, uint16_t* grad_k, uint16_t* grad_v, float* grad_w,
                         const Bf16State& state, const Bf16State& grads, float* scratch,
                         int* non_finite, cudaStream_t stream) {
  bf16_state_summaries(p, k, v, state, stream);
  bf16_state_mix(p, w, false, state.summaries, state.normalisers, state.mixed,
                 state.mixed_normalisers, stream);
  bf16_state_query_side(p, q, grad_o, state, grads, grad_q, non_finite, stream);
  bf16_state_mix(p, w, true, grads.mixed, grads.mixed_normalisers, grads.summaries,
                 grads.normalisers, stream);
  if (grad_w != nullptr)
    bf16_state_weight_gradient(p, grads.mixed, grads.mixed_normalisers, state.summaries,
                               state.normalisers, grad_w, scratch, non_finite, stream);
  bf16_state_key_value_side(p, k, v, grads, grad_k, grad_v, non_finite, stream);
}

}  // namespace mhla::cuda
