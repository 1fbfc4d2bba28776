#include "cuda/bf16_backward_kernels.cuh"
#include "cuda/bf16_tiles.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace tiles;

// Grid (block b x chunk of kTile tokens, slice bh). Two passes over the tiles
// of Dk: the first sums phi(q_t) . u_t and den_t per token, which give the
// terms; the second writes grad_q (recomputing u, unless Dk is one tile and
// u is still in shared memory).
__global__ void __launch_bounds__(kThreads)
    query_gradients_kernel(KernelProblem p, int64_t chunks, const uint16_t* q,
                           const uint16_t* grad_o, const float* mixed, uint16_t* grad_q,
                           float* terms, int* non_finite) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;
  __shared__ int64_t rows[kTile];
  __shared__ float inv[kTile], dden[kTile];

  int64_t block;
  if (!chunk_rows(p, chunks, block, rows)) return;
  const int64_t bh = blockIdx.y, width = p.dv + 1;
  const float* m = mixed + (bh * p.blocks + block) * p.dk * width;
  // u_t = mixed[:, :Dv] grad_o_t for the Dk entries [dk0, dk0 + kTile), into out.
  const auto u_tile = [&](int64_t dk0) {
    Accumulators acc;
    clear(acc);
    rows_product<BLoad::by_inner>(
        acc, stage, 0, p.dv,
        [&](int r, int64_t e) {
          return rows[r] >= 0 ? to_float(grad_o[rows[r] * p.dv + e]) : 0.0f;
        },
        [&](int64_t e, int j) { return dk0 + j < p.dk ? m[(dk0 + j) * width + e] : 0.0f; },
        NothingPerStage{});
    store_rows(acc, out);
    __syncthreads();
  };

  const int t = threadIdx.x;  // threads t < kTile: the chunk's token t
  float den = 0, dot = 0;
  for (int64_t dk0 = 0; dk0 < p.dk; dk0 += kTile) {
    u_tile(dk0);
    if (t < kTile && rows[t] >= 0)
      for (int a = 0; a < kTile && dk0 + a < p.dk; ++a) {
        const float phi = feature(p.phi, to_float(q[rows[t] * p.dk + dk0 + a]));
        dot += phi * out[t][a];
        den += phi * m[(dk0 + a) * width + p.dv];
      }
    __syncthreads();
  }
  if (t < kTile) {
    const float i_t = p.normalize ? 1.0f / (den + float(p.eps)) : float(p.scale);
    const float d_t = p.normalize ? -dot * i_t * i_t : 0.0f;
    inv[t] = i_t;
    dden[t] = d_t;
    if (rows[t] >= 0) {
      terms[2 * rows[t]] = i_t;
      terms[2 * rows[t] + 1] = d_t;
      if (!isfinite(i_t) || !isfinite(d_t)) atomicOr(non_finite, 1);
    }
  }
  __syncthreads();

  for (int64_t dk0 = 0; dk0 < p.dk; dk0 += kTile) {
    if (p.dk > kTile) u_tile(dk0);
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, a = e % kTile;
      if (rows[r] < 0 || dk0 + a >= p.dk) continue;
      const int64_t at = rows[r] * p.dk + dk0 + a;
      const float g = feature_derivative(p.phi, to_float(q[at])) *
                      (inv[r] * out[r][a] + dden[r] * m[(dk0 + a) * width + p.dv]);
      if (!isfinite(g)) atomicOr(non_finite, 1);
      grad_q[at] = to_bits(g);
    }
    __syncthreads();
  }
}

// Grid (block b, slice bh, Dk tile x Dv tile): the tile of
// grad_mixed_b = sum_t phi(q_t) [inv_t grad_o_t | dden_t], as the summaries
// kernel sums phi(k_t) [v_t | 1].
__global__ void __launch_bounds__(kThreads)
    mixed_gradients_kernel(KernelProblem p, const uint16_t* q, const uint16_t* grad_o,
                           const float* terms, float* grad_mixed) {
  __shared__ __align__(32) TokenStage stage;
  __shared__ __align__(32) OutTile out;

  const BlockSumTile tile(p);

  Accumulators acc;
  clear(acc);
  float last = 0;  // sum of phi(q_t) dden_t over the block for Dk entry tile.dk0 + threadIdx.x
  tokens_product(
      acc, stage, tile.count,
      [&](int64_t j, int d) {
        return tile.dk0 + d < p.dk ? feature(p.phi, to_float(q[tile.row(j) * p.dk + tile.dk0 + d]))
                                   : 0.0f;
      },
      [&](int64_t j, int e) {
        if (tile.dv0 + e >= p.dv) return 0.0f;
        const int64_t r = tile.row(j);
        return terms[2 * r] * to_float(grad_o[r * p.dv + tile.dv0 + e]);
      },
      [&](const TokenStage& staged, int64_t c0) {
        if (threadIdx.x < kTile)
          for (int j = 0; j < kChunk && c0 + j < tile.count; ++j)
            last += joined(staged.a_hi[j][threadIdx.x], staged.a_lo[j][threadIdx.x]) *
                    terms[2 * tile.row(c0 + j) + 1];
      });

  store_rows(acc, out);
  __syncthreads();
  store_summary_tile(p, out, last, tile.dk0, tile.dv0, tile.in(grad_mixed));
}

// Grid (block b x chunk of kTile tokens, slice bh, Dk tiles then Dv tiles):
// a tile of grad_k, phi'(k) times [v | 1] [dS | dz]^T (the ones as one more
// inner entry), or of grad_v, phi(K) dS.
__global__ void __launch_bounds__(kThreads)
    key_value_gradients_kernel(KernelProblem p, int64_t chunks, const uint16_t* k,
                               const uint16_t* v, const float* grad_s, uint16_t* grad_k,
                               uint16_t* grad_v, int* non_finite) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;
  __shared__ int64_t rows[kTile];

  int64_t block;
  if (!chunk_rows(p, chunks, block, rows)) return;
  const int64_t bh = blockIdx.y, width = p.dv + 1, dk_tiles = tile_count(p.dk);
  const float* ds = grad_s + (bh * p.blocks + block) * p.dk * width;

  Accumulators acc;
  clear(acc);
  if (int64_t(blockIdx.z) < dk_tiles) {
    const int64_t dk0 = int64_t(blockIdx.z) * kTile;
    rows_product<BLoad::by_inner>(
        acc, stage, 0, width,
        [&](int r, int64_t e) {
          return rows[r] < 0 ? 0.0f : e < p.dv ? to_float(v[rows[r] * p.dv + e]) : 1.0f;
        },
        [&](int64_t e, int j) { return dk0 + j < p.dk ? ds[(dk0 + j) * width + e] : 0.0f; },
        NothingPerStage{});
    store_rows(acc, out);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, a = e % kTile;
      if (rows[r] < 0 || dk0 + a >= p.dk) continue;
      const int64_t at = rows[r] * p.dk + dk0 + a;
      const float g = feature_derivative(p.phi, to_float(k[at])) * out[r][a];
      if (!isfinite(g)) atomicOr(non_finite, 1);
      grad_k[at] = to_bits(g);
    }
    return;
  }
  const int64_t dv0 = (int64_t(blockIdx.z) - dk_tiles) * kTile;
  rows_product<BLoad::by_column>(
      acc, stage, 0, p.dk,
      [&](int r, int64_t a) {
        return rows[r] >= 0 ? feature(p.phi, to_float(k[rows[r] * p.dk + a])) : 0.0f;
      },
      [&](int64_t a, int j) { return dv0 + j < p.dv ? ds[a * width + dv0 + j] : 0.0f; },
      NothingPerStage{});
  store_rows(acc, out);
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, j = e % kTile;
    if (rows[r] < 0 || dv0 + j >= p.dv) continue;
    const float g = out[r][j];
    if (!isfinite(g)) atomicOr(non_finite, 1);
    grad_v[rows[r] * p.dv + dv0 + j] = to_bits(g);
  }
}

}  // namespace

void bf16_query_gradients(const KernelProblem& p, const uint16_t* q, const uint16_t* grad_o,
                          const float* mixed, uint16_t* grad_q, float* terms, int* non_finite,
                          cudaStream_t stream) {
  const int64_t chunks = tile_count(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads));
  query_gradients_kernel<<<grid, kThreads, 0, stream>>>(p, chunks, q, grad_o, mixed, grad_q, terms,
                                                        non_finite);
  check_launch("bf16 query gradients kernel");
}

void bf16_mixed_gradients(const KernelProblem& p, const uint16_t* q, const uint16_t* grad_o,
                          const float* terms, float* grad_mixed, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dk) * tile_count(p.dv)));
  mixed_gradients_kernel<<<grid, kThreads, 0, stream>>>(p, q, grad_o, terms, grad_mixed);
  check_launch("bf16 mixed gradients kernel");
}

void bf16_key_value_gradients(const KernelProblem& p, const uint16_t* k, const uint16_t* v,
                              const float* grad_summaries, uint16_t* grad_k, uint16_t* grad_v,
                              int* non_finite, cudaStream_t stream) {
  const int64_t chunks = tile_count(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dk) + tile_count(p.dv)));
  key_value_gradients_kernel<<<grid, kThreads, 0, stream>>>(p, chunks, k, v, grad_summaries, grad_k,
                                                            grad_v, non_finite);
  check_launch("bf16 key and value gradients kernel");
}

}  // namespace mhla::cuda
