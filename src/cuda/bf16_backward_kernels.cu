#include "cuda/bf16_backward_kernels.cuh"
#include "cuda/bf16_tiles.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace tiles;

// Grid (block b x chunk of kTile tokens, slice bh). Pass 1 sums, per token,
// den_t and g_t . y_t: phi(q_t) . z and phi(q_t) . u_t over the tiles of Dk,
// u_t = mixed[:, :Dv] g_t, and with token-level causal masking the block's
// keys up to t (the masked scores, and their product with v against g). They
// give the terms, and (causal) the chunk's part of W[i, i]'s gradient. Pass 2
// writes grad_q a tile of Dk at a time: [inv_t g_t | dden_t] against the
// mixed summaries (z as one more inner entry), plus (causal) the masked
// W[i, i] (inv_t g_t . v_j + dden_t) against phi(k_j).
template <typename Tok>
__global__ void __launch_bounds__(kThreads)
    query_gradients_kernel(KernelProblem p, int64_t chunks, TokensIn<Tok> q, TokensIn<Tok> k,
                           TokensIn<Tok> v, TokensIn<Tok> grad_o, const float* w,
                           const float* mixed, TokensOut<Tok> grad_q, float* terms, float* diagonal,
                           int* non_finite) {
  __shared__ __align__(32) StageOrTile scratch;
  __shared__ __align__(32) OutTile out;
  __shared__ int64_t rows[kTile], keys[kTile];
  __shared__ float inv[kTile], dden[kTile], in_block[kTile];

  TokenChunk chunk;
  if (!chunk_rows(p, chunks, chunk, rows)) {
    // A chunk past the block's end adds nothing to W[i, i]'s gradient.
    if (p.causal && threadIdx.x == 0) diagonal[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = 0;
    return;
  }
  RowStage& stage = scratch.stage;
  const int64_t bh = blockIdx.y, width = p.dv + 1;
  const float* m = mixed + (bh * p.blocks + chunk.block) * p.dk * width;
  const float w_ii = p.causal ? weight(p, w, bh % p.heads, chunk.block, chunk.block) : 0.0f;
  const auto phi_q = [&](int t, int64_t a) {
    return rows[t] >= 0 ? feature(p.phi, Tok::value(q[rows[t] * p.dk + a])) : 0.0f;
  };
  const auto phi_k = [&](int j, int64_t a) {
    return keys[j] >= 0 ? feature(p.phi, Tok::value(k[keys[j] * p.dk + a])) : 0.0f;
  };
  const auto g = [&](int t, int64_t e) {
    return rows[t] >= 0 ? Tok::value(grad_o[rows[t] * p.dv + e]) : 0.0f;
  };
  const auto value = [&](int j, int64_t e) {
    return keys[j] >= 0 ? Tok::value(v[keys[j] * p.dv + e]) : 0.0f;
  };
  // Key j of the chunk from position k0 is visible to the chunk's token t.
  const auto visible = [&](int t, int j, int64_t k0) { return k0 + j <= chunk.c0 + t; };

  const int t = threadIdx.x;  // threads t < kTile: the chunk's token t
  float den = 0, dot = 0;
  for (int64_t dk0 = 0; dk0 < p.dk; dk0 += kTile) {
    pair_products(stage, out, p.dv, g, [&](int j, int64_t e) {
      return dk0 + j < p.dk ? m[(dk0 + j) * width + e] : 0.0f;
    });
    // phi(q) of the chunk's tokens in this Dk tile, read coalesced by all
    // threads into the stage's place, then summed per token.
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, a = e % kTile;
      scratch.tile[r][a] = dk0 + a < p.dk ? phi_q(r, dk0 + a) : 0.0f;
    }
    __syncthreads();
    if (t < kTile && rows[t] >= 0)
      for (int a = 0; a < kTile && dk0 + a < p.dk; ++a) {
        const float phi = scratch.tile[t][a];
        dot += phi * out[t][a];
        den += phi * m[(dk0 + a) * width + p.dv];
      }
    __syncthreads();
  }
  float scores = 0, products = 0;  // causal: sum_j s_tj and sum_j s_tj (g_t . v_j), j <= t
  for (int64_t k0 = 0; p.causal && k0 <= chunk.c0; k0 += kTile) {
    block_rows(p, chunk, k0, keys);
    __syncthreads();
    pair_products(stage, out, p.dk, phi_q, phi_k);
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads)
      if (!visible(e / kTile, e % kTile, k0)) out[e / kTile][e % kTile] = 0.0f;
    __syncthreads();
    if (t < kTile)
      for (int j = 0; j < kTile; ++j) scores += out[t][j];
    for (int64_t dv0 = 0; dv0 < p.dv; dv0 += kTile) {
      Accumulators y;
      clear(y);
      rows_product<BLoad::by_column>(
          y, stage, 0, kTile, [&](int r, int64_t j) { return out[r][j]; },
          [&](int64_t j, int e) { return dv0 + e < p.dv ? value(int(j), dv0 + e) : 0.0f; },
          NothingPerStage{});
      store_rows(y, scratch.tile);
      __syncthreads();
      if (t < kTile)
        for (int e = 0; e < kTile && dv0 + e < p.dv; ++e)
          products += g(t, dv0 + e) * scratch.tile[t][e];
      __syncthreads();
    }
  }
  if (t < kTile) {
    den += w_ii * scores;
    dot += w_ii * products;
    const float i_t = p.normalize ? 1.0f / (den + float(p.eps)) : float(p.scale);
    const float d_t = p.normalize ? -dot * i_t * i_t : 0.0f;
    inv[t] = i_t;
    dden[t] = d_t;
    // sum_j s_tj (dy_t . [v_j | 1]): token t's part of W[i, i]'s gradient.
    in_block[t] = rows[t] >= 0 ? i_t * products + d_t * scores : 0.0f;
    if (rows[t] >= 0) {
      terms[2 * rows[t]] = i_t;
      terms[2 * rows[t] + 1] = d_t;
      if (!isfinite(i_t) || !isfinite(d_t)) atomicOr(non_finite, 1);
    }
  }
  __syncthreads();
  if (p.causal && t == 0) {
    float sum = 0;
    for (int r = 0; r < kTile; ++r) sum += in_block[r];
    diagonal[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = sum;
  }

  for (int64_t dk0 = 0; dk0 < p.dk; dk0 += kTile) {
    Accumulators acc;
    clear(acc);
    rows_product<BLoad::by_inner>(
        acc, stage, 0, width,
        [&](int r, int64_t e) {
          return e < p.dv ? inv[r] * g(r, e) : rows[r] >= 0 ? dden[r] : 0.0f;
        },
        [&](int64_t e, int a) { return dk0 + a < p.dk ? m[(dk0 + a) * width + e] : 0.0f; },
        NothingPerStage{});
    for (int64_t k0 = 0; p.causal && k0 <= chunk.c0; k0 += kTile) {
      block_rows(p, chunk, k0, keys);
      __syncthreads();
      pair_products(stage, out, p.dv, g, value);
      for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
        const int r = e / kTile, j = e % kTile;
        out[r][j] = visible(r, j, k0) ? w_ii * (inv[r] * out[r][j] + dden[r]) : 0.0f;
      }
      __syncthreads();
      rows_product<BLoad::by_column>(
          acc, stage, 0, kTile, [&](int r, int64_t j) { return out[r][j]; },
          [&](int64_t j, int a) { return dk0 + a < p.dk ? phi_k(int(j), dk0 + a) : 0.0f; },
          NothingPerStage{});
    }
    store_rows(acc, out);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, a = e % kTile;
      if (rows[r] < 0 || dk0 + a >= p.dk) continue;
      const int64_t at = rows[r] * p.dk + dk0 + a;
      const float gq = feature_derivative(p.phi, Tok::value(q[at])) * out[r][a];
      if (!store_token<Tok>(gq, grad_q[at])) atomicOr(non_finite, 1);
    }
    __syncthreads();
  }
}

// Grid (block b, slice bh, Dk tile x Dv tile): the tile of
// grad_mixed_b = sum_t phi(q_t) [inv_t grad_o_t | dden_t], as the summaries
// kernel sums phi(k_t) [v_t | 1].
template <typename Tok>
__global__ void __launch_bounds__(kThreads)
    mixed_gradients_kernel(KernelProblem p, TokensIn<Tok> q, TokensIn<Tok> grad_o,
                           const float* terms, float* grad_mixed) {
  __shared__ __align__(32) TokenStage stage;
  __shared__ __align__(32) OutTile out;

  const BlockSumTile tile(p);

  Accumulators acc;
  clear(acc);
  float last = 0;  // sum of phi(q_t) dden_t over the block for Dk entry tile.dk0 + threadIdx.x
  tokens_product(
      acc, stage, tile.count, [&](int64_t j, int d) { return tile.template feature_of<Tok>(q, j, d); },
      [&](int64_t j, int e) {
        if (tile.dv0 + e >= p.dv) return 0.0f;
        const int64_t r = tile.row(j);
        return terms[2 * r] * Tok::value(grad_o[r * p.dv + tile.dv0 + e]);
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

// Grid (block b x chunk of kTile keys, slice bh, Dk tiles then Dv tiles): a
// tile of grad_k, phi'(k) times [v | 1] [dS | dz]^T (the ones as one more
// inner entry), or of grad_v, phi(K) dS; with token-level causal masking
// plus the block's queries t >= j, a chunk of kTile at a time: W[i, i]
// (inv_t g_t . v_j + dden_t) against phi(q_t), or W[i, i] s_tj inv_t against g_t.
template <typename Tok>
__global__ void __launch_bounds__(kThreads)
    key_value_gradients_kernel(KernelProblem p, int64_t chunks, TokensIn<Tok> q, TokensIn<Tok> k,
                               TokensIn<Tok> v, TokensIn<Tok> grad_o, const float* w,
                               const float* terms, const float* grad_s, TokensOut<Tok> grad_k,
                               TokensOut<Tok> grad_v, int* non_finite) {
  __shared__ __align__(32) RowStage stage;
  __shared__ __align__(32) OutTile out;
  __shared__ int64_t rows[kTile], queries[kTile];
  __shared__ float inv[kTile], dden[kTile];

  TokenChunk chunk;
  if (!chunk_rows(p, chunks, chunk, rows)) return;
  const int64_t bh = blockIdx.y, width = p.dv + 1, dk_tiles = tile_count(p.dk);
  const float* ds = grad_s + (bh * p.blocks + chunk.block) * p.dk * width;
  const float w_ii = p.causal ? weight(p, w, bh % p.heads, chunk.block, chunk.block) : 0.0f;
  const bool key_tile = int64_t(blockIdx.z) < dk_tiles;
  const int64_t col0 = (key_tile ? int64_t(blockIdx.z) : int64_t(blockIdx.z) - dk_tiles) * kTile;
  const auto phi_k = [&](int j, int64_t a) {
    return rows[j] >= 0 ? feature(p.phi, Tok::value(k[rows[j] * p.dk + a])) : 0.0f;
  };
  const auto value = [&](int j, int64_t e) {
    return rows[j] >= 0 ? Tok::value(v[rows[j] * p.dv + e]) : 0.0f;
  };
  const auto phi_q = [&](int t, int64_t a) {
    return queries[t] >= 0 ? feature(p.phi, Tok::value(q[queries[t] * p.dk + a])) : 0.0f;
  };
  const auto g = [&](int t, int64_t e) {
    return queries[t] >= 0 ? Tok::value(grad_o[queries[t] * p.dv + e]) : 0.0f;
  };

  Accumulators acc;
  clear(acc);
  if (key_tile)
    rows_product<BLoad::by_inner>(
        acc, stage, 0, width,
        [&](int r, int64_t e) { return e < p.dv       ? value(r, e)
                                       : rows[r] >= 0 ? 1.0f
                                                      : 0.0f; },
        [&](int64_t e, int j) { return col0 + j < p.dk ? ds[(col0 + j) * width + e] : 0.0f; },
        NothingPerStage{});
  else
    rows_product<BLoad::by_column>(
        acc, stage, 0, p.dk, phi_k,
        [&](int64_t a, int j) { return col0 + j < p.dv ? ds[a * width + col0 + j] : 0.0f; },
        NothingPerStage{});
  for (int64_t q0 = chunk.c0; p.causal && q0 < chunk.count; q0 += kTile) {
    block_rows(p, chunk, q0, queries);
    if (threadIdx.x < kTile) {  // the thread that wrote queries[threadIdx.x]
      const int64_t r = queries[threadIdx.x];
      inv[threadIdx.x] = r >= 0 ? terms[2 * r] : 0.0f;
      dden[threadIdx.x] = r >= 0 ? terms[2 * r + 1] : 0.0f;
    }
    __syncthreads();
    // out[j][t]: v_j . g_t (grad_k) or phi(k_j) . phi(q_t) (grad_v), then its masked factor.
    if (key_tile)
      pair_products(stage, out, p.dv, value, g);
    else
      pair_products(stage, out, p.dk, phi_k, phi_q);
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int j = e / kTile, t = e % kTile;
      const bool visible = chunk.c0 + j <= q0 + t;
      out[j][t] = !visible   ? 0.0f
                  : key_tile ? w_ii * (inv[t] * out[j][t] + dden[t])
                             : w_ii * inv[t] * out[j][t];
    }
    __syncthreads();
    rows_product<BLoad::by_column>(
        acc, stage, 0, kTile, [&](int j, int64_t t) { return out[j][t]; },
        [&](int64_t t, int c) {
          if (key_tile) return col0 + c < p.dk ? phi_q(int(t), col0 + c) : 0.0f;
          return col0 + c < p.dv ? g(int(t), col0 + c) : 0.0f;
        },
        NothingPerStage{});
  }

  store_rows(acc, out);
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    if (rows[r] < 0) continue;
    if (key_tile) {
      if (col0 + c >= p.dk) continue;
      const int64_t at = rows[r] * p.dk + col0 + c;
      const float gk = feature_derivative(p.phi, Tok::value(k[at])) * out[r][c];
      if (!store_token<Tok>(gk, grad_k[at])) atomicOr(non_finite, 1);
    } else {
      if (col0 + c >= p.dv) continue;
      if (!store_token<Tok>(out[r][c], grad_v[rows[r] * p.dv + col0 + c]))
        atomicOr(non_finite, 1);
    }
  }
}

}  // namespace

void bf16_query_gradients(const KernelProblem& p, const void* q, const void* k, const void* v,
                          const void* grad_o, const float* w, const float* mixed, void* grad_q,
                          float* terms, float* diagonal, int* non_finite, cudaStream_t stream) {
  const int64_t chunks = tile_count(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads));
  with_token_format(p.token_format, [&](auto token) {
    using Tok = decltype(token);
    query_gradients_kernel<Tok><<<grid, kThreads, 0, stream>>>(
        p, chunks, static_cast<TokensIn<Tok>>(q), static_cast<TokensIn<Tok>>(k),
        static_cast<TokensIn<Tok>>(v), static_cast<TokensIn<Tok>>(grad_o), w, mixed,
        static_cast<TokensOut<Tok>>(grad_q), terms, diagonal, non_finite);
  });
  check_launch("bf16 query gradients kernel");
}

int64_t bf16_diagonal_terms(const KernelProblem& p) {
  return p.batch * p.heads * p.blocks * tile_count(p.largest_block);
}

void bf16_mixed_gradients(const KernelProblem& p, const void* q, const void* grad_o,
                          const float* terms, float* grad_mixed, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dk) * tile_count(p.dv)));
  with_token_format(p.token_format, [&](auto token) {
    using Tok = decltype(token);
    mixed_gradients_kernel<Tok><<<grid, kThreads, 0, stream>>>(
        p, static_cast<TokensIn<Tok>>(q), static_cast<TokensIn<Tok>>(grad_o), terms, grad_mixed);
  });
  check_launch("bf16 mixed gradients kernel");
}

void bf16_key_value_gradients(const KernelProblem& p, const void* q, const void* k, const void* v,
                              const void* grad_o, const float* w, const float* terms,
                              const float* grad_summaries, void* grad_k, void* grad_v,
                              int* non_finite, cudaStream_t stream) {
  const int64_t chunks = tile_count(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads),
                  unsigned(tile_count(p.dk) + tile_count(p.dv)));
  with_token_format(p.token_format, [&](auto token) {
    using Tok = decltype(token);
    key_value_gradients_kernel<Tok><<<grid, kThreads, 0, stream>>>(
        p, chunks, static_cast<TokensIn<Tok>>(q), static_cast<TokensIn<Tok>>(k),
        static_cast<TokensIn<Tok>>(v), static_cast<TokensIn<Tok>>(grad_o), w, terms, grad_summaries,
        static_cast<TokensOut<Tok>>(grad_k), static_cast<TokensOut<Tok>>(grad_v), non_finite);
  });
  check_launch("bf16 key and value gradients kernel");
}

}  // namespace mhla::cuda
