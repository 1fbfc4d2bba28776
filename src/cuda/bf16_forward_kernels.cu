#include <cuda_bf16.h>
#include <mma.h>

#include "cuda/bf16_forward_kernels.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

// One CTA: 4 warps, a 64 x 64 tile of results, 16 rows per warp (four 16 x 16
// accumulators each). Shared rows are padded by 8 bfloat16 (16 bytes) or 4
// floats, which keeps WMMA's 32-byte fragment alignment and spreads the banks.
constexpr int kWarps = 4, kThreads = 32 * kWarps, kTile = 64, kFrag = 16;
constexpr int kChunk = 32;  // tokens (summaries) or Dk entries (outputs) per step
constexpr int kPad = 8, kOutPad = 4;
constexpr int64_t kMaxGrid = 65535;  // gridDim.y and gridDim.z

using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

__device__ inline float to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// x as hi + lo, both bfloat16.
__device__ inline void split(float x, bf16& hi, bf16& lo) {
  hi = __float2bfloat16_rn(x);
  lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

__host__ __device__ inline int64_t tiles(int64_t extent) { return (extent + kTile - 1) / kTile; }

// acc[n] += (A_hi + A_lo) (B_hi + B_lo) over one kFrag-deep step, all but
// the lo*lo term: A is this warp's 16 rows (row-major, leading dimension lda),
// B the tile's 64 columns (row-major, ldb).
__device__ inline void split_product_step(Accumulator (&acc)[kTile / kFrag], const bf16* a_hi,
                                          const bf16* a_lo, int lda, const bf16* b_hi,
                                          const bf16* b_lo, int ldb) {
  wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::row_major> ah, al;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(al, a_lo, lda);
  for (int n = 0; n < kTile / kFrag; ++n) {
    wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major> bh, bl;
    wmma::load_matrix_sync(bh, b_hi + n * kFrag, ldb);
    wmma::load_matrix_sync(bl, b_lo + n * kFrag, ldb);
    wmma::mma_sync(acc[n], ah, bh, acc[n]);
    wmma::mma_sync(acc[n], ah, bl, acc[n]);
    wmma::mma_sync(acc[n], al, bh, acc[n]);
  }
}

// This warp's 16 rows of the tile's accumulators into out (row-major).
__device__ inline void store_rows(const Accumulator (&acc)[kTile / kFrag],
                                  float (&out)[kTile][kTile + kOutPad], int warp) {
  for (int n = 0; n < kTile / kFrag; ++n)
    wmma::store_matrix_sync(&out[warp * kFrag][n * kFrag], acc[n], kTile + kOutPad,
                            wmma::mem_row_major);
}

// Grid (block b, slice bh, Dk tile x Dv tile). Each step stages kChunk of the
// block's tokens: phi(k) split in two, v as it is (already bfloat16).
__global__ void __launch_bounds__(kThreads)
    summaries_kernel(KernelProblem p, const uint16_t* k, const uint16_t* v, float* s) {
  __shared__ __align__(32) bf16 k_hi[kChunk][kTile + kPad];
  __shared__ __align__(32) bf16 k_lo[kChunk][kTile + kPad];
  __shared__ __align__(32) bf16 vs[kChunk][kTile + kPad];
  __shared__ __align__(32) float out[kTile][kTile + kOutPad];

  const int64_t block = blockIdx.x, bh = blockIdx.y;
  const int64_t bb = bh / p.heads, h = bh % p.heads;
  const int64_t dv_tiles = tiles(p.dv);
  const int64_t dk0 = int64_t(blockIdx.z) / dv_tiles * kTile,
                dv0 = int64_t(blockIdx.z) % dv_tiles * kTile;
  const int warp = threadIdx.x / 32;
  const int64_t first = p.block_start[block], count = p.block_start[block + 1] - first;

  Accumulator acc[kTile / kFrag];
  for (Accumulator& a : acc) wmma::fill_fragment(a, 0.0f);
  float z = 0;  // sum of phi(k) over the block for Dk entry dk0 + threadIdx.x

  for (int64_t c0 = 0; c0 < count; c0 += kChunk) {
    for (int e = threadIdx.x; e < kChunk * kTile; e += kThreads) {
      const int j = e / kTile, d = e % kTile;
      float key = 0, value = 0;  // tokens past the block's end add nothing
      if (c0 + j < count) {
        const int64_t row = token_row(p, bb, p.block_tokens[first + c0 + j], h);
        if (dk0 + d < p.dk) key = feature(p.phi, to_float(k[row * p.dk + dk0 + d]));
        if (dv0 + d < p.dv) value = to_float(v[row * p.dv + dv0 + d]);
      }
      split(key, k_hi[j][d], k_lo[j][d]);
      vs[j][d] = __float2bfloat16_rn(value);  // exact: v is bfloat16
    }
    __syncthreads();
    if (threadIdx.x < kTile)
      for (int j = 0; j < kChunk; ++j)
        z += __bfloat162float(k_hi[j][threadIdx.x]) + __bfloat162float(k_lo[j][threadIdx.x]);
    for (int step = 0; step < kChunk; step += kFrag) {
      // A = phi(K)^T: element (dk, t) sits at [t][dk], column-major.
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::col_major> a_hi, a_lo;
      wmma::load_matrix_sync(a_hi, &k_hi[step][warp * kFrag], kTile + kPad);
      wmma::load_matrix_sync(a_lo, &k_lo[step][warp * kFrag], kTile + kPad);
      for (int n = 0; n < kTile / kFrag; ++n) {
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(b, &vs[step][n * kFrag], kTile + kPad);
        wmma::mma_sync(acc[n], a_hi, b, acc[n]);
        wmma::mma_sync(acc[n], a_lo, b, acc[n]);
      }
    }
    __syncthreads();
  }

  store_rows(acc, out, warp);
  __syncthreads();
  const int64_t width = p.dv + 1;
  float* dst = s + (bh * p.blocks + block) * p.dk * width;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int i = e / kTile, j = e % kTile;
    if (dk0 + i < p.dk && dv0 + j < p.dv) dst[(dk0 + i) * width + dv0 + j] = out[i][j];
  }
  if (dv0 == 0 && threadIdx.x < kTile && dk0 + threadIdx.x < p.dk)
    dst[(dk0 + threadIdx.x) * width + p.dv] = z;
}

// Grid (block b x chunk of kTile tokens, slice bh, Dv tile). Each step stages
// kChunk entries of Dk: phi(q) and the mixed summaries, both split in two.
__global__ void __launch_bounds__(kThreads)
    outputs_kernel(KernelProblem p, int64_t chunks, const uint16_t* q, const float* mixed,
                   uint16_t* o, int* non_finite) {
  __shared__ __align__(32) bf16 q_hi[kTile][kChunk + kPad];
  __shared__ __align__(32) bf16 q_lo[kTile][kChunk + kPad];
  __shared__ __align__(32) bf16 m_hi[kChunk][kTile + kPad];
  __shared__ __align__(32) bf16 m_lo[kChunk][kTile + kPad];
  __shared__ __align__(32) float out[kTile][kTile + kOutPad];
  __shared__ float denominator[kTile];
  __shared__ int64_t rows[kTile];

  const int64_t block = blockIdx.x / chunks, c0 = int64_t(blockIdx.x) % chunks * kTile;
  const int64_t first = p.block_start[block], count = p.block_start[block + 1] - first;
  if (c0 >= count) return;  // the whole CTA leaves: this block has fewer chunks
  const int64_t bh = blockIdx.y, bb = bh / p.heads, h = bh % p.heads;
  const int64_t dv0 = int64_t(blockIdx.z) * kTile, width = p.dv + 1;
  const float* m = mixed + (bh * p.blocks + block) * p.dk * width;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x < kTile)
    rows[threadIdx.x] = c0 + threadIdx.x < count
                            ? token_row(p, bb, p.block_tokens[first + c0 + threadIdx.x], h)
                            : -1;
  __syncthreads();

  Accumulator acc[kTile / kFrag];
  for (Accumulator& a : acc) wmma::fill_fragment(a, 0.0f);
  float den = 0;  // phi(q) . z for token c0 + threadIdx.x

  for (int64_t a0 = 0; a0 < p.dk; a0 += kChunk) {
    for (int e = threadIdx.x; e < kTile * kChunk; e += kThreads) {
      const int t = e / kChunk, a = e % kChunk;
      const float x = rows[t] >= 0 && a0 + a < p.dk
                          ? feature(p.phi, to_float(q[rows[t] * p.dk + a0 + a]))
                          : 0.0f;
      split(x, q_hi[t][a], q_lo[t][a]);
    }
    for (int e = threadIdx.x; e < kChunk * kTile; e += kThreads) {
      const int a = e / kTile, j = e % kTile;
      const float x = a0 + a < p.dk && dv0 + j < p.dv ? m[(a0 + a) * width + dv0 + j] : 0.0f;
      split(x, m_hi[a][j], m_lo[a][j]);
    }
    __syncthreads();
    if (threadIdx.x < kTile)
      for (int a = 0; a < kChunk && a0 + a < p.dk; ++a)
        den += (__bfloat162float(q_hi[threadIdx.x][a]) + __bfloat162float(q_lo[threadIdx.x][a])) *
               m[(a0 + a) * width + p.dv];
    for (int step = 0; step < kChunk; step += kFrag)
      split_product_step(acc, &q_hi[warp * kFrag][step], &q_lo[warp * kFrag][step], kChunk + kPad,
                         &m_hi[step][0], &m_lo[step][0], kTile + kPad);
    __syncthreads();
  }

  store_rows(acc, out, warp);
  if (threadIdx.x < kTile) denominator[threadIdx.x] = den;
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int t = e / kTile, j = e % kTile;
    if (rows[t] < 0 || dv0 + j >= p.dv) continue;
    const float y = out[t][j];
    const float r = p.normalize ? y / (denominator[t] + float(p.eps)) : float(p.scale) * y;
    if (!isfinite(r) || (p.normalize && !isfinite(denominator[t]))) atomicOr(non_finite, 1);
    o[rows[t] * p.dv + dv0 + j] = __bfloat16_as_ushort(__float2bfloat16_rn(r));
  }
}

// Grid (64 rows of W, 64 columns of the summaries, slice bh): mixed = W S on
// one slice, S its [M, Dk (Dv + 1)] summaries. Each step stages 32 blocks:
// W's entries as the masking lets each row read them, and S, both split.
__global__ void __launch_bounds__(kThreads)
    mix_kernel(KernelProblem p, const float* w, const float* s, float* mixed) {
  __shared__ __align__(32) bf16 w_hi[kTile][kChunk + kPad];
  __shared__ __align__(32) bf16 w_lo[kTile][kChunk + kPad];
  __shared__ __align__(32) bf16 s_hi[kChunk][kTile + kPad];
  __shared__ __align__(32) bf16 s_lo[kChunk][kTile + kPad];
  __shared__ __align__(32) float out[kTile][kTile + kOutPad];

  const int64_t i0 = int64_t(blockIdx.x) * kTile, f0 = int64_t(blockIdx.y) * kTile, bh = blockIdx.z;
  const int64_t width = p.dk * (p.dv + 1), h = bh % p.heads;
  const float* slice = s + bh * p.blocks * width;
  const int warp = threadIdx.x / 32;
  // Lower-triangular and Toeplitz rows read no block past their own.
  const int64_t last = p.lower_triangular || p.toeplitz ? min(p.blocks, i0 + kTile) : p.blocks;

  Accumulator acc[kTile / kFrag];
  for (Accumulator& a : acc) wmma::fill_fragment(a, 0.0f);
  for (int64_t b0 = 0; b0 < last; b0 += kChunk) {
    for (int e = threadIdx.x; e < kTile * kChunk; e += kThreads) {
      const int i = e / kChunk, b = e % kChunk;
      const int64_t row = i0 + i, col = b0 + b;
      const float x =
          row < p.blocks && col < p.blocks && reads(p, row, col) ? weight(p, w, h, row, col) : 0.0f;
      split(x, w_hi[i][b], w_lo[i][b]);
    }
    for (int e = threadIdx.x; e < kChunk * kTile; e += kThreads) {
      const int b = e / kTile, j = e % kTile;
      const float x = b0 + b < p.blocks && f0 + j < width ? slice[(b0 + b) * width + f0 + j] : 0.0f;
      split(x, s_hi[b][j], s_lo[b][j]);
    }
    __syncthreads();
    for (int step = 0; step < kChunk; step += kFrag)
      split_product_step(acc, &w_hi[warp * kFrag][step], &w_lo[warp * kFrag][step], kChunk + kPad,
                         &s_hi[step][0], &s_lo[step][0], kTile + kPad);
    __syncthreads();
  }

  store_rows(acc, out, warp);
  __syncthreads();
  float* dst = mixed + bh * p.blocks * width;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int i = e / kTile, j = e % kTile;
    if (i0 + i < p.blocks && f0 + j < width) dst[(i0 + i) * width + f0 + j] = out[i][j];
  }
}

}  // namespace

bool bf16_kernels_fit(const KernelProblem& p) {
  return p.batch * p.heads <= kMaxGrid && tiles(p.dk) * tiles(p.dv) <= kMaxGrid && p.blocks > 0 &&
         p.blocks * tiles(p.largest_block) <= int64_t(INT32_MAX) &&
         tiles(p.dk * (p.dv + 1)) <= kMaxGrid && p.first_block == 0 && p.mixing_blocks == p.blocks;
}

void bf16_summaries(const KernelProblem& p, const uint16_t* k, const uint16_t* v, float* summaries,
                    cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.batch * p.heads),
                  unsigned(tiles(p.dk) * tiles(p.dv)));
  summaries_kernel<<<grid, kThreads, 0, stream>>>(p, k, v, summaries);
  check_launch("bf16 summaries kernel");
}

void bf16_mix(const KernelProblem& p, const float* w, const float* summaries, float* mixed,
              cudaStream_t stream) {
  const dim3 grid(unsigned(tiles(p.blocks)), unsigned(tiles(p.dk * (p.dv + 1))),
                  unsigned(p.batch * p.heads));
  mix_kernel<<<grid, kThreads, 0, stream>>>(p, w, summaries, mixed);
  check_launch("bf16 mix kernel");
}

void bf16_outputs(const KernelProblem& p, const uint16_t* q, const float* mixed, uint16_t* o,
                  int* non_finite, cudaStream_t stream) {
  const int64_t chunks = tiles(p.largest_block);
  const dim3 grid(unsigned(p.blocks * chunks), unsigned(p.batch * p.heads), unsigned(tiles(p.dv)));
  outputs_kernel<<<grid, kThreads, 0, stream>>>(p, chunks, q, mixed, o, non_finite);
  check_launch("bf16 outputs kernel");
}

}  // namespace mhla::cuda
