// Compiled once per target instruction set; see block_gemm.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/decode_token.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <algorithm>

#include "cpu/simd/decode_token.hpp"
#include "cpu/simd/partial_vectors-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Up to kMaxVectors vectors of y stay in registers while the Dk state rows
// stream past; each state element is read once (prefix) or read and written
// once (running). Two accumulator sets (even and odd rows) plus the values and
// three broadcasts must fit the register file: 4 vectors with 32 registers
// (AVX-512), 2 with 16 (AVX2, SSE4), or the accumulators spill to the stack
// and every row waits on a store-to-load round trip.
constexpr int kMaxVectors = HWY_MAX_BYTES >= 64 ? 4 : 2;

// State row a: running[a, :] += kap[a] v, and sum += u[a] (prefix[a, :] + wii running[a, :]).
template <int V, bool kMasked>
HWY_INLINE void Row(int64_t a, int64_t x1, int64_t j0, size_t tail, const float* kap,
                    const VecF (&values)[V], const float* u, VecF w, const float* prefix,
                    float* running, VecF (&sum)[V]) {
  const Tag d;
  const size_t lanes = hn::Lanes(d);
  const VecF ka = hn::Set(d, kap[a]), ua = hn::Set(d, u[a]);
  float* run = running + a * x1 + j0;
  const float* pre = prefix + a * x1 + j0;
#pragma GCC unroll 4
  for (int i = 0; i < V; ++i) {
    if (kMasked && i == V - 1) {
      const VecF r = hn::MulAdd(ka, values[i], LoadFirst(run + i * lanes, tail));
      StoreFirst(r, run + i * lanes, tail);
      sum[i] = hn::MulAdd(ua, hn::MulAdd(w, r, LoadFirst(pre + i * lanes, tail)), sum[i]);
    } else {
      const VecF r = hn::MulAdd(ka, values[i], hn::LoadU(d, run + i * lanes));
      hn::StoreU(r, d, run + i * lanes);
      sum[i] = hn::MulAdd(ua, hn::MulAdd(w, r, hn::LoadU(d, pre + i * lanes)), sum[i]);
    }
  }
}

template <int V, bool kMasked>
HWY_INLINE void Columns(int64_t dk, int64_t x1, int64_t j0, size_t tail, const float* kap,
                        const float* v, const float* u, float wii, const float* prefix,
                        float* running, float* y) {
  const Tag d;
  const size_t lanes = hn::Lanes(d);
  const VecF w = hn::Set(d, wii);
  // Even and odd rows feed separate accumulators, each FMA chain then waiting
  // on every other row; the row pairs are unrolled so that both sets are
  // named statically and stay in registers.
  VecF values[V], even[V], odd[V];
#pragma GCC unroll 4
  for (int i = 0; i < V; ++i) {
    values[i] = (kMasked && i == V - 1) ? LoadFirst(v + j0 + i * lanes, tail)
                                        : hn::LoadU(d, v + j0 + i * lanes);
    even[i] = odd[i] = hn::Zero(d);
  }
  int64_t a = 0;
  for (; a + 1 < dk; a += 2) {
    Row<V, kMasked>(a, x1, j0, tail, kap, values, u, w, prefix, running, even);
    Row<V, kMasked>(a + 1, x1, j0, tail, kap, values, u, w, prefix, running, odd);
  }
  if (a < dk) Row<V, kMasked>(a, x1, j0, tail, kap, values, u, w, prefix, running, even);
#pragma GCC unroll 4
  for (int i = 0; i < V; ++i) {
    const VecF total = hn::Add(even[i], odd[i]);
    if (kMasked && i == V - 1)
      StoreFirst(total, y + j0 + i * lanes, tail);
    else
      hn::StoreU(total, d, y + j0 + i * lanes);
  }
}

template <bool kMasked>
HWY_INLINE void ColumnsOfWidth(int vectors, int64_t dk, int64_t x1, int64_t j0, size_t tail,
                               const float* kap, const float* v, const float* u, float wii,
                               const float* prefix, float* running, float* y) {
  switch (vectors) {
    case 1:
      return Columns<1, kMasked>(dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
    case 2:
      return Columns<2, kMasked>(dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
    default:
      if constexpr (kMaxVectors >= 4) {
        if (vectors == 3)
          return Columns<3, kMasked>(dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
        return Columns<4, kMasked>(dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
      }
  }
}

float DecodeTokenImpl(int64_t dk, int64_t dv, const float* kap, const float* v, const float* u,
                      float wii, const float* prefix, float* running, float* y) {
  const int64_t x1 = dv + 1, lanes = int64_t(hn::Lanes(Tag()));
  const int64_t panel = kMaxVectors * lanes;
  for (int64_t j0 = 0; j0 < dv; j0 += panel) {
    const int64_t cols = std::min(panel, dv - j0);
    const int vectors = int((cols + lanes - 1) / lanes);
    const size_t tail = size_t(cols - (vectors - 1) * lanes);
    if (int64_t(tail) == lanes)
      ColumnsOfWidth<false>(vectors, dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
    else
      ColumnsOfWidth<true>(vectors, dk, x1, j0, tail, kap, v, u, wii, prefix, running, y);
  }
  // The key-sum column, one element per state row, into four partial sums
  // (one chain would wait on every row).
  float den[4] = {0, 0, 0, 0};
  for (int64_t a = 0; a < dk; ++a) {
    float& r = running[a * x1 + dv];
    r += kap[a];
    den[a & 3] += u[a] * (prefix[a * x1 + dv] + wii * r);
  }
  return (den[0] + den[1]) + (den[2] + den[3]);
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

HWY_EXPORT(DecodeTokenImpl);

float decode_token(int64_t dk, int64_t dv, const float* kap, const float* v, const float* u,
                   float wii, const float* prefix, float* running, float* y) {
  return HWY_DYNAMIC_DISPATCH(DecodeTokenImpl)(dk, dv, kap, v, u, wii, prefix, running, y);
}

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
