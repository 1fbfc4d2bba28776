#include "cuda/bf16_forward_kernels.cuh"
#include "cuda/bf16_tiles.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace tiles;

// Grid (block b, slice bh, Dk tile x Dv tile): the tile of
// [S_b | z_b] = phi(K_b)^T [V_b | 1], staging kChunk of the block's tokens at a time.
template <typename Tok>
__global__ void __launch_bounds__(kThreads)
    summaries_kernel(KernelProblem p, TokensIn<Tok> k, TokensIn<Tok> v, float* s) {
  __shared__ __align__(32) TokenStage stage;
  __shared__ __align__(32) OutTile out;

  const BlockSumTile tile(p);

  Accumulators acc;
  clear(acc);
  float z = 0;  // sum of phi(k) over the block for Dk entry tile.dk0 + threadIdx.x
  tokens_product(
      acc, stage, tile.count, [&](int64_t j, int d) { return tile.template feature_of<Tok>(k, j, d); },
      [&](int64_t j, int e) {
        return tile.dv0 + e < p.dv ? Tok::value(v[tile.row(j) * p.dv + tile.dv0 + e]) : 0.0f;
      },
      [&](const TokenStage& staged, int64_t) {
        if (threadIdx.x < kTile)
          for (int j = 0; j < kChunk; ++j)
            z += joined(staged.a_hi[j][threadIdx.x], staged.a_lo[j][threadIdx.x]);
      });

  store_rows(acc, out);
  __syncthreads();
  store_summary_tile(p, out, z, tile.dk0, tile.dv0, tile.in(s));
}

// Grid (block b x chunk of kTile tokens, slice bh, Dv tile): o for the
// chunk's tokens, phi(Q) times the block's mixed summaries (with token-level
// causal masking, plus W[i, i] times the block's keys up to each token),
// divided by the denominators as they are written.
template <typename Tok>
__global__ void __launch_bounds__(kThreads)
    outputs_kernel(KernelProblem p, int64_t chunks, TokensIn<Tok> q, TokensIn<Tok> k,
                   TokensIn<Tok> v, const float* w, const float* mixed, TokensOut<Tok> o,
                   int* non_finite) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;
  __shared__ float denominator[kTile];
  __shared__ int64_t rows[kTile], keys[kTile];

  TokenChunk chunk;
  if (!chunk_rows(p, chunks, chunk, rows)) return;
  const int64_t bh = blockIdx.y, dv0 = int64_t(blockIdx.z) * kTile, width = p.dv + 1;
  const float* m = mixed + (bh * p.blocks + chunk.block) * p.dk * width;
  const auto phi_q = [&](int t, int64_t a) {
    return rows[t] >= 0 ? feature(p.phi, Tok::value(q[rows[t] * p.dk + a])) : 0.0f;
  };

  Accumulators acc;
  clear(acc);
  float den = 0;  // the denominator of the chunk's token threadIdx.x
  rows_product<BLoad::by_column>(
      acc, stage, 0, p.dk, phi_q,
      [&](int64_t a, int j) { return dv0 + j < p.dv ? m[a * width + dv0 + j] : 0.0f; },
      [&](const RowStage& staged, int64_t a0) {
        if (threadIdx.x < kTile)
          for (int a = 0; a < kChunk && a0 + a < p.dk; ++a)
            den += joined(staged.a_hi[threadIdx.x][a], staged.a_lo[threadIdx.x][a]) *
                   m[(a0 + a) * width + p.dv];
      });
  // Causal: W[i, i] (phi(q_t) . phi(k_j)) [v_j | 1] over the block's keys j <= t,
  // kTile keys at a time: their masked scores in out, then against v.
  for (int64_t k0 = 0; p.causal && k0 <= chunk.c0; k0 += kTile) {
    const float diagonal = weight(p, w, bh % p.heads, chunk.block, chunk.block);
    block_rows(p, chunk, k0, keys);
    __syncthreads();
    pair_products(stage, out, p.dk, phi_q, [&](int j, int64_t a) {
      return keys[j] >= 0 ? feature(p.phi, Tok::value(k[keys[j] * p.dk + a])) : 0.0f;
    });
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int t = e / kTile, j = e % kTile;
      out[t][j] = k0 + j <= chunk.c0 + t ? diagonal * out[t][j] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < kTile)
      for (int j = 0; j < kTile; ++j) den += out[threadIdx.x][j];
    rows_product<BLoad::by_column>(
        acc, stage, 0, kTile, [&](int t, int64_t j) { return out[t][j]; },
        [&](int64_t j, int e) {
          return keys[j] >= 0 && dv0 + e < p.dv ? Tok::value(v[keys[j] * p.dv + dv0 + e]) : 0.0f;
        },
        NothingPerStage{});
  }

  store_rows(acc, out);
  if (threadIdx.x < kTile) denominator[threadIdx.x] = den;
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int t = e / kTile, j = e % kTile;
    if (rows[t] < 0 || dv0 + j >= p.dv) continue;
    const float y = out[t][j];
    const float r = p.normalize ? y / (denominator[t] + float(p.eps)) : float(p.scale) * y;
    if (!store_token<Tok>(r, o[rows[t] * p.dv + dv0 + j]) ||
        (p.normalize && !isfinite(denominator[t])))
      atomicOr(non_finite, 1);
  }
}

}  // namespace

bool bf16_kernels_fit(const KernelProblem& p) {
  const int64_t dk_tiles = tile_count(p.dk), dv_tiles = tile_count(p.dv);
  return p.batch * p.heads <= kMaxGridYZ && dk_tiles * dv_tiles <= kMaxGridYZ &&
         dk_tiles + dv_tiles <= kMaxGridYZ && p.blocks > 0 && tile_count(p.blocks) <= kMaxGridYZ &&
         p.blocks * tile_count(p.largest_block) <= int64_t(INT32_MAX) &&
         tile_count(p.dk * (p.dv + 1)) <= kMaxGridYZ && p.first_block == 0 &&
         p.mixing_blocks == p.blocks;
}

void bf16_summaries(const KernelProblem& p, const void* k, const void* v, float* summaries,
                    cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dk) * tile_count(p.dv)));
  with_token_format(p.token_format, [&](auto token) {
    using Tok = decltype(token);
    summaries_kernel<Tok><<<grid, kThreads, 0, stream>>>(p, static_cast<TokensIn<Tok>>(k),
                                                         static_cast<TokensIn<Tok>>(v), summaries);
  });
  check_launch("bf16 summaries kernel");
}

void bf16_outputs(const KernelProblem& p, const void* q, const void* k, const void* v,
                  const float* w, const float* mixed, void* o, int* non_finite,
                  cudaStream_t stream) {
  const int64_t chunks = tile_count(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dv)));
  with_token_format(p.token_format, [&](auto token) {
    using Tok = decltype(token);
    outputs_kernel<Tok><<<grid, kThreads, 0, stream>>>(
        p, chunks, static_cast<TokensIn<Tok>>(q), static_cast<TokensIn<Tok>>(k),
        static_cast<TokensIn<Tok>>(v), w, mixed, static_cast<TokensOut<Tok>>(o), non_finite);
  });
  check_launch("bf16 outputs kernel");
}

}  // namespace mhla::cuda
