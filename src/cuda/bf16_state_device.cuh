#pragma once
// The device machinery every bfloat16-state kernel shares (the forward's in
// bf16_state_forward.cu, the mix's in bf16_state_mix.cu, the backward's in
// bf16_state_backward.cu): 16-byte asynchronous copies into a double-buffered
// main loop (float16 tokens rounded to bfloat16 as they are staged), phi on
// operand fragments in registers, and results leaving a warp's fragment as
// 16-byte rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "cuda/bf16_state_plan.hpp"
#include "cuda/device_helpers.cuh"

namespace mhla::cuda::state {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;
using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;
template <class Layout>
using OperandA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, Layout>;
template <class Layout>
using OperandB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, Layout>;
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

// 8 float16 (16 bytes) rounded to 8 bfloat16, to nearest even.
__device__ inline uint4 float16_as_bfloat16(uint4 raw) {
  uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[u]));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    words[u] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// One staged segment of a token tensor: bfloat16 tokens by an asynchronous
// copy; float16 tokens through registers, rounded to bfloat16 on the way, so
// that every product and staged read after it is the same for both formats
// (a plain store, made visible by the same barriers as the copies).
__device__ inline void stage_token_segment(const KernelProblem& p, bf16* to, const uint16_t* base,
                                           int64_t offset) {
  if (p.token_format == TokenFormat::bfloat16) {
    stage_segment(to, base, offset);
    return;
  }
  const uint4 raw =
      offset >= 0 ? *reinterpret_cast<const uint4*>(base + offset) : make_uint4(0u, 0u, 0u, 0u);
  *reinterpret_cast<uint4*>(to) = float16_as_bfloat16(raw);
}

// Tokens [c0, c0 + kRows) of block `block` of slice `slice` of the token
// tensor `source` (`width` entries a row) into `tile`, a 16-byte segment a
// copy, thread t copying segments t, t + threads, ...; rows past the block
// and entries past the width are zeros.
template <int kRows, int kColumns>
__device__ inline void stage_block_rows(bf16 (&tile)[kRows][kColumns], const uint16_t* source,
                                        const KernelProblem& p, const Slice& slice, int64_t block,
                                        int c0, int64_t width) {
  constexpr int kSegments = (kColumns - kPad) / kSegment;
  for (int g = threadIdx.x; g < kRows * kSegments; g += blockDim.x) {
    const Segment sg = segment_of<kSegments>(g);
    stage_token_segment(
        p, &tile[sg.row][sg.column], source,
        row_segment(block_token_row(p, slice, block, c0 + sg.row), sg.column, width));
  }
}

// Rows [0, rows) of one block's state [Dk, Dv] at `state` into `tile`;
// rows past Dk and entries past Dv are zeros.
template <int kRows, int kColumns>
__device__ inline void stage_state_rows(bf16 (&tile)[kRows][kColumns], const uint16_t* state,
                                        const KernelProblem& p, int rows) {
  constexpr int kSegments = (kColumns - kPad) / kSegment;
  for (int g = threadIdx.x; g < rows * kSegments; g += blockDim.x) {
    const Segment sg = segment_of<kSegments>(g);
    stage_segment(&tile[sg.row][sg.column], state,
                  row_segment(sg.row < p.dk ? sg.row : -1, sg.column, p.dv));
  }
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

// phi in place on every row of a staged tile, entries [0, Dk), where two
// feature-mapped operands meet (the causal in-block scores): the zero-filled
// entries past Dk stay zeros, so that the product adds nothing there, as
// either operand mapped in registers alone would not (elu1 maps 0 to 1).
template <int kRows, int kColumns>
__device__ void map_features(bf16 (&tile)[kRows][kColumns], const KernelProblem& p) {
  if (p.phi == FeatureMap::identity) return;
  const int dk = int(p.dk);
  for (int g = threadIdx.x; g < kRows * dk; g += blockDim.x) {
    bf16& x = tile[g / dk][g % dk];
    x = __float2bfloat16_rn(feature(p.phi, __bfloat162float(x)));
  }
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
// 8 floats as 8 tokens of the problem's format (a 16-byte store); whether
// all 8 tokens are finite (a float16 overflows from 65520).
__device__ inline bool store_tokens(const KernelProblem& p, uint16_t* to,
                                    const float (&x)[kSegment]) {
  if (p.token_format == TokenFormat::bfloat16) {
    store_rounded(to, x);
    return true;  // bfloat16 has float32's range: the caller checked x
  }
  uint32_t words[4];
  bool finite = true;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const __half2 h = __floats2half2_rn(x[2 * u], x[2 * u + 1]);
    finite = finite && !__hisinf(__low2half(h)) && !__hisinf(__high2half(h));
    words[u] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(to) = make_uint4(words[0], words[1], words[2], words[3]);
  return finite;
}
// 8 staged bfloat16 entries as floats, from one 16-byte shared load.
__device__ inline void load_staged(const bf16* from, float (&x)[kSegment]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(from);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    x[2 * u] = __uint_as_float(words[u] << 16);
    x[2 * u + 1] = __uint_as_float(words[u] & 0xffff0000u);
  }
}

// acc[n] += phi(X)^T Y over a staged chunk's tokens [0, valid): X's rows
// are tokens of kMaxDim entries (this warp's 16 of them become the result's
// rows), Y's are tokens of the result's kColumnFragments x 16 columns; one
// bfloat16 product a 16-token step (zero rows past `valid` add nothing).
template <int kTokens, int kColumnFragments>
__device__ inline void add_outer_products(Accumulator (&acc)[kColumnFragments],
                                          const bf16 (&x)[kTokens][kMaxDim + kPad],
                                          const bf16 (&y)[kTokens][kColumnFragments * kFrag + kPad],
                                          FeatureMap phi, int warp, int valid) {
#pragma unroll
  for (int step = 0; step < kTokens; step += kFrag) {
    if (step >= valid) break;
    OperandA<wmma::col_major> a;  // phi(X)^T: entry (d, j) at x[j][d]
    wmma::load_matrix_sync(a, &x[step][warp * kFrag], kMaxDim + kPad);
    apply_feature(phi, a);
#pragma unroll
    for (int n = 0; n < kColumnFragments; ++n) {
      OperandB<wmma::row_major> b;
      wmma::load_matrix_sync(b, &y[step][n * kFrag], kColumnFragments * kFrag + kPad);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
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

// The kernel's dynamic shared memory as its layout (the backward's CTAs
// stage a whole state row tile, past the 48 KB a kernel gets without asking:
// its launches ask, bf16_state_backward.cu's launch_with_shared).
template <class Layout>
__device__ inline Layout& dynamic_shared() {
  extern __shared__ __align__(128) unsigned char dynamic_bytes[];
  return *reinterpret_cast<Layout*>(dynamic_bytes);
}

}  // namespace mhla::cuda::state
