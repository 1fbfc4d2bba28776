#pragma once
// The tile machinery of the bfloat16 tensor-core kernels (WMMA, sm_80 and
// later): one CTA of 4 warps computes a 64 x 64 tile of float results, 16 rows
// per warp (four 16 x 16 accumulators each), from operands staged in shared
// memory 32 inner entries at a time. Every operand is split into two bfloat16
// halves, hi = bf16(x) and lo = bf16(x - hi), and a product adds all but the
// lo*lo term: about 16 bits of mantissa, so results stay near float32 (an
// operand that is already bfloat16 splits with lo = 0).
//
// Two shapes of product cover every kernel:
// - rows_product: a tile of rows (tokens, or rows of W) times a matrix,
//   A [rows, inner] B [inner, columns], e.g. phi(Q_b) mixed_b;
// - tokens_product: a sum over a block's tokens of outer products,
//   A^T B with A [tokens, rows] and B [tokens, columns], e.g. phi(K_b)^T V_b.
// The operands come from loaders (device lambdas returning the float value of
// one element, called only inside the problem) so that each kernel says what
// it multiplies and the staging is written once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "cuda/device_helpers.cuh"

namespace mhla::cuda::tiles {

using bf16 = __nv_bfloat16;

// Shared rows are padded by 8 bfloat16 (16 bytes) or 4 floats, which keeps
// WMMA's 32-byte fragment alignment and spreads the banks.
constexpr int kWarps = 4, kThreads = 32 * kWarps, kTile = 64, kFrag = 16;
constexpr int kChunk = 32;  // inner entries (or tokens) staged per step
constexpr int kPad = 8, kOutPad = 4;
constexpr int64_t kMaxGridYZ = 65535;  // gridDim.y and gridDim.z

// Blocks of kThreads covering `total` one-thread-per-element results (the
// kernels stride over the rest).
inline unsigned elementwise_blocks(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : blocks < (int64_t(1) << 30) ? blocks : int64_t(1) << 30);
}

using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kFrag, kFrag, kFrag, float>;
using Accumulators = Accumulator[kTile / kFrag];
using OutTile = float[kTile][kTile + kOutPad];

__host__ __device__ inline int64_t tile_count(int64_t extent) {
  return (extent + kTile - 1) / kTile;
}

// A token of format F: its stored value read as float (exact) and a float
// written as one (to nearest, ties to even). A float16 token splits into
// two bfloat16 halves exactly (11 significant bits in 8 + 8), so both 16-bit
// formats run the same split products; a float32 token keeps 16 of its 24
// significant bits in them (2^-17 relative).
template <TokenFormat F>
struct Token;
template <>
struct Token<TokenFormat::bfloat16> {
  using Storage = uint16_t;
  __device__ static float value(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }
  __device__ static uint16_t stored(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};
template <>
struct Token<TokenFormat::float16> {
  using Storage = uint16_t;
  __device__ static float value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
  __device__ static uint16_t stored(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
template <>
struct Token<TokenFormat::float32> {
  using Storage = float;
  __device__ static float value(float x) { return x; }
  __device__ static float stored(float x) { return x; }
};

// A kernel's token arrays, of Tok's storage type (the host passes them as
// void pointers: with_token_format).
template <typename Tok>
using TokensIn = const typename Tok::Storage*;
template <typename Tok>
using TokensOut = typename Tok::Storage*;

// Writes x as a token of Tok's format; whether the token is finite (a finite
// float beyond float16's range is not).
template <typename Tok>
__device__ inline bool store_token(float x, typename Tok::Storage& to) {
  const typename Tok::Storage stored = Tok::stored(x);
  to = stored;
  return isfinite(Tok::value(stored));
}

// Calls launch(Token<F>{}) for the problem's token format F: the host side
// of a kernel templated on it, whose token pointers arrive as void and are
// cast to Token<F>::Storage there.
template <typename Launch>
void with_token_format(TokenFormat format, Launch&& launch) {
  if (format == TokenFormat::float16)
    launch(Token<TokenFormat::float16>{});
  else if (format == TokenFormat::float32)
    launch(Token<TokenFormat::float32>{});
  else
    launch(Token<TokenFormat::bfloat16>{});
}

// x as hi + lo, both bfloat16.
__device__ inline void split(float x, bf16& hi, bf16& lo) {
  hi = __float2bfloat16_rn(x);
  lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

// kGroup consecutive entries of one staged row are split by one thread and
// stored with one 16-byte store per half: the index arithmetic of a row is
// shared by its entries (the loaders inline, so it is computed once) and the
// stores are an eighth as many as one per entry.
constexpr int kGroup = 8;

struct SplitGroup {
  bf16 hi[kGroup], lo[kGroup];

  // Entry u is value(u); entries where inside(u) is false are zero.
  template <class Inside, class Value>
  __device__ SplitGroup(const Inside& inside, const Value& value) {
    for (int u = 0; u < kGroup; ++u) split(inside(u) ? value(u) : 0.0f, hi[u], lo[u]);
  }
  // Stores both halves at hi_dst and lo_dst, 16-byte aligned.
  __device__ void store(bf16* hi_dst, bf16* lo_dst) const {
    *reinterpret_cast<uint4*>(hi_dst) = packed(hi);
    *reinterpret_cast<uint4*>(lo_dst) = packed(lo);
  }

 private:
  __device__ static uint32_t pair(bf16 a, bf16 b) {
    return uint32_t(__bfloat16_as_ushort(a)) | uint32_t(__bfloat16_as_ushort(b)) << 16;
  }
  __device__ static uint4 packed(const bf16 (&x)[kGroup]) {
    return make_uint4(pair(x[0], x[1]), pair(x[2], x[3]), pair(x[4], x[5]), pair(x[6], x[7]));
  }
};

// hi + lo as a float: the staged value of an operand.
__device__ inline float joined(bf16 hi, bf16 lo) {
  return __bfloat162float(hi) + __bfloat162float(lo);
}

__device__ inline void clear(Accumulators& acc) {
  for (Accumulator& a : acc) nvcuda::wmma::fill_fragment(a, 0.0f);
}

// This warp's 16 rows of the tile's accumulators into out (row-major).
__device__ inline void store_rows(const Accumulators& acc, OutTile& out) {
  const int warp = threadIdx.x / 32;
  for (int n = 0; n < kTile / kFrag; ++n)
    nvcuda::wmma::store_matrix_sync(&out[warp * kFrag][n * kFrag], acc[n], kTile + kOutPad,
                                    nvcuda::wmma::mem_row_major);
}

// The staging of rows_product: A's kTile rows x kChunk inner entries and B's
// kChunk inner entries x kTile columns, each split in two. B is staged by
// rows, or by columns (transposed) where consecutive inner entries are
// consecutive in memory, so that each thread stores a group of them at once.
struct RowStage {
  bf16 a_hi[kTile][kChunk + kPad];
  bf16 a_lo[kTile][kChunk + kPad];
  union {
    struct {
      bf16 hi[kChunk][kTile + kPad];
      bf16 lo[kChunk][kTile + kPad];
    } rows;
    struct {
      bf16 hi[kTile][kChunk + kPad];
      bf16 lo[kTile][kChunk + kPad];
    } columns;
  } b;
};

// A rows product's staging or, between products, a second result tile.
union StageOrTile {
  RowStage stage;
  OutTile tile;
};

// The staging of tokens_product: kChunk tokens of A's kTile rows and of B's
// kTile columns, each split in two.
struct TokenStage {
  bf16 a_hi[kChunk][kTile + kPad];
  bf16 a_lo[kChunk][kTile + kPad];
  bf16 b_hi[kChunk][kTile + kPad];
  bf16 b_lo[kChunk][kTile + kPad];
};

// acc[n] += (A_hi + A_lo) (B_hi + B_lo) over one kFrag-deep step, all but the
// lo*lo term: A is this warp's 16 rows (fragments of layout ALayout, leading
// dimension lda), B the tile's 64 columns (fragments of layout BLayout,
// leading dimension ldb, each kFrag columns b_next entries after the last).
template <class ALayout, class BLayout = nvcuda::wmma::row_major>
__device__ inline void split_product_step(Accumulators& acc, const bf16* a_hi, const bf16* a_lo,
                                          int lda, const bf16* b_hi, const bf16* b_lo,
                                          int ldb = kTile + kPad, int b_next = kFrag) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, ALayout> ah, al;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(al, a_lo, lda);
  for (int n = 0; n < kTile / kFrag; ++n) {
    wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, BLayout> bh, bl;
    wmma::load_matrix_sync(bh, b_hi + n * b_next, ldb);
    wmma::load_matrix_sync(bl, b_lo + n * b_next, ldb);
    wmma::mma_sync(acc[n], ah, bh, acc[n]);
    wmma::mma_sync(acc[n], ah, bl, acc[n]);
    wmma::mma_sync(acc[n], al, bh, acc[n]);
  }
}

// Which index of B consecutive threads load: its column (B row-major in
// memory) or its inner entry (B stored transposed, e.g. the rows of a
// summary read as columns), so that the loads stay coalesced.
enum class BLoad { by_column, by_inner };

// acc += A B over inner entries [begin, end): A(t, a) for the tile's row t,
// B(a, j) for its column j (floats; zero where the loader has no element,
// e.g. rows or columns past the problem). after_stage(stage, a0) runs with
// each staged chunk, between the barriers (e.g. for a sum over the rows).
template <BLoad kBLoad, class LoadA, class LoadB, class AfterStage>
__device__ void rows_product(Accumulators& acc, RowStage& s, int64_t begin, int64_t end,
                             const LoadA& load_a, const LoadB& load_b,
                             const AfterStage& after_stage) {
  const int warp = threadIdx.x / 32;
  for (int64_t a0 = begin; a0 < end; a0 += kChunk) {
    for (int g = threadIdx.x; g < kTile * kChunk / kGroup; g += kThreads) {
      const int t = g / (kChunk / kGroup), a = g % (kChunk / kGroup) * kGroup;
      SplitGroup([&](int u) { return a0 + a + u < end; },
                 [&](int u) { return load_a(t, a0 + a + u); })
          .store(&s.a_hi[t][a], &s.a_lo[t][a]);
    }
    if constexpr (kBLoad == BLoad::by_column) {
      for (int g = threadIdx.x; g < kChunk * kTile / kGroup; g += kThreads) {
        const int a = g / (kTile / kGroup), j = g % (kTile / kGroup) * kGroup;
        SplitGroup([&](int) { return a0 + a < end; }, [&](int u) { return load_b(a0 + a, j + u); })
            .store(&s.b.rows.hi[a][j], &s.b.rows.lo[a][j]);
      }
    } else {  // B by columns: B(a, j) at columns[j][a]
      for (int g = threadIdx.x; g < kTile * kChunk / kGroup; g += kThreads) {
        const int j = g / (kChunk / kGroup), a = g % (kChunk / kGroup) * kGroup;
        SplitGroup([&](int u) { return a0 + a + u < end; },
                   [&](int u) { return load_b(a0 + a + u, j); })
            .store(&s.b.columns.hi[j][a], &s.b.columns.lo[j][a]);
      }
    }
    __syncthreads();
    after_stage(s, a0);
    for (int step = 0; step < kChunk; step += kFrag) {
      const bf16 *a_hi = &s.a_hi[warp * kFrag][step], *a_lo = &s.a_lo[warp * kFrag][step];
      using nvcuda::wmma::col_major, nvcuda::wmma::row_major;
      if constexpr (kBLoad == BLoad::by_column)
        split_product_step<row_major>(acc, a_hi, a_lo, kChunk + kPad, &s.b.rows.hi[step][0],
                                      &s.b.rows.lo[step][0]);
      else  // column n of B starts at columns[n][step], kChunk + kPad entries after column n - 1
        split_product_step<row_major, col_major>(
            acc, a_hi, a_lo, kChunk + kPad, &s.b.columns.hi[0][step], &s.b.columns.lo[0][step],
            kChunk + kPad, kFrag * (kChunk + kPad));
    }
    __syncthreads();
  }
}

// acc += A^T B over tokens [0, count): A(j, d) for token j and the tile's row
// d, B(j, e) for its column e; after_stage(stage, c0) as above.
template <class LoadA, class LoadB, class AfterStage>
__device__ void tokens_product(Accumulators& acc, TokenStage& s, int64_t count, const LoadA& load_a,
                               const LoadB& load_b, const AfterStage& after_stage) {
  const int warp = threadIdx.x / 32;
  for (int64_t c0 = 0; c0 < count; c0 += kChunk) {
    for (int g = threadIdx.x; g < kChunk * kTile / kGroup; g += kThreads) {
      const int j = g / (kTile / kGroup), d = g % (kTile / kGroup) * kGroup;
      const auto inside = [&](int) { return c0 + j < count; };  // tokens past the end add nothing
      SplitGroup(inside, [&](int u) {
        return load_a(c0 + j, d + u);
      }).store(&s.a_hi[j][d], &s.a_lo[j][d]);
      SplitGroup(inside, [&](int u) {
        return load_b(c0 + j, d + u);
      }).store(&s.b_hi[j][d], &s.b_lo[j][d]);
    }
    __syncthreads();
    after_stage(s, c0);
    // A^T: element (d, j) sits at [j][d], column-major.
    for (int step = 0; step < kChunk; step += kFrag)
      split_product_step<nvcuda::wmma::col_major>(acc, &s.a_hi[step][warp * kFrag],
                                                  &s.a_lo[step][warp * kFrag], kTile + kPad,
                                                  &s.b_hi[step][0], &s.b_lo[step][0]);
    __syncthreads();
  }
}

// Where a CTA that sums over one block's tokens works (grid x: block, y:
// slice bh, z: Dk tile x Dv tile): its tile of a [Dk, Dv + 1] array and the
// block's tokens, row(j) being token j's row in the token tensors.
struct BlockSumTile {
  const KernelProblem& p;
  int64_t block, bh, dk0, dv0, first, count;
  int64_t batch_entry, head;  // of slice bh, divided out once: rows are read per element

  __device__ explicit BlockSumTile(const KernelProblem& problem)
      : p(problem), block(blockIdx.x), bh(blockIdx.y) {
    const int64_t dv_tiles = tile_count(p.dv);
    dk0 = int64_t(blockIdx.z) / dv_tiles * kTile;
    dv0 = int64_t(blockIdx.z) % dv_tiles * kTile;
    first = p.block_start[block];
    count = p.block_start[block + 1] - first;
    batch_entry = bh / p.heads;
    head = bh % p.heads;
  }
  __device__ int64_t row(int64_t j) const {
    return token_row(p, batch_entry, p.block_tokens[first + j], head);
  }
  // phi of entry dk0 + d of token j's row in a [B, N, H, Dk] tensor (0 past Dk).
  template <typename Tok>
  __device__ float feature_of(const typename Tok::Storage* x, int64_t j, int d) const {
    return dk0 + d < p.dk ? feature(p.phi, Tok::value(x[row(j) * p.dk + dk0 + d])) : 0.0f;
  }
  // This block's [Dk, Dv + 1] array in a [B*H, M, Dk, Dv + 1] one.
  __device__ float* in(float* array) const {
    return array + (bh * p.blocks + block) * p.dk * (p.dv + 1);
  }
};

// A CTA that takes kTile tokens of one block (grid x: block x chunk, grid y:
// slice bh): the block, where its tokens start in block_tokens, how many it
// has, and the first of the chunk's (a position in the block).
struct TokenChunk {
  int64_t block, first, count, c0;
};

// rows[t] = the row in the token tensors of token c + t of the chunk's block
// (slice blockIdx.y), or -1 past the block's end. Callers synchronise.
__device__ inline void block_rows(const KernelProblem& p, const TokenChunk& chunk, int64_t c,
                                  int64_t (&rows)[kTile]) {
  const int64_t bh = blockIdx.y;
  if (threadIdx.x < kTile)
    rows[threadIdx.x] = c + threadIdx.x < chunk.count
                            ? token_row(p, bh / p.heads,
                                        p.block_tokens[chunk.first + c + threadIdx.x], bh % p.heads)
                            : -1;
}

// Sets the CTA's chunk and the rows of its tokens. Returns false, before any
// barrier, where the block has fewer chunks: the whole CTA leaves.
__device__ inline bool chunk_rows(const KernelProblem& p, int64_t chunks, TokenChunk& chunk,
                                  int64_t (&rows)[kTile]) {
  chunk.block = blockIdx.x / chunks;
  chunk.c0 = int64_t(blockIdx.x) % chunks * kTile;
  chunk.first = p.block_start[chunk.block];
  chunk.count = p.block_start[chunk.block + 1] - chunk.first;
  if (chunk.c0 >= chunk.count) return false;
  block_rows(p, chunk, chunk.c0, rows);
  __syncthreads();
  return true;
}

// One CTA's tile of a [Dk, Dv + 1] summary-shaped array (rows from dk0,
// columns from dv0) from out, after its barrier; the CTA of the first Dv tile
// also writes the last column, `last` of thread t for row dk0 + t.
__device__ inline void store_summary_tile(const KernelProblem& p, const OutTile& out, float last,
                                          int64_t dk0, int64_t dv0, float* dst) {
  const int64_t width = p.dv + 1;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int i = e / kTile, j = e % kTile;
    if (dk0 + i < p.dk && dv0 + j < p.dv) dst[(dk0 + i) * width + dv0 + j] = out[i][j];
  }
  if (dv0 == 0 && threadIdx.x < kTile && dk0 + threadIdx.x < p.dk)
    dst[(dk0 + threadIdx.x) * width + p.dv] = last;
}

// out[t][j] = sum_a X(t, a) Y(j, a) over a in [0, inner): products of two
// sets of kTile token rows, e.g. the scores phi(q_t) . phi(k_j); returns
// after the barrier that makes out readable.
template <class LoadX, class LoadY>
__device__ void pair_products(RowStage& stage, OutTile& out, int64_t inner, const LoadX& x,
                              const LoadY& y);

// No work between a stage's barriers.
struct NothingPerStage {
  template <class Stage>
  __device__ void operator()(const Stage&, int64_t) const {}
};

template <class LoadX, class LoadY>
__device__ void pair_products(RowStage& stage, OutTile& out, int64_t inner, const LoadX& x,
                              const LoadY& y) {
  Accumulators acc;
  clear(acc);
  rows_product<BLoad::by_inner>(
      acc, stage, 0, inner, x, [&](int64_t a, int j) { return y(j, a); }, NothingPerStage{});
  store_rows(acc, out);
  __syncthreads();
}

}  // namespace mhla::cuda::tiles
