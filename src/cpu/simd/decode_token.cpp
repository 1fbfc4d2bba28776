// Compiled once per target instruction set; see block_gemm.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/decode_token.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <algorithm>

#include "cpu/simd/decode_token.hpp"
#include "cpu/simd/partial_vectors-inl.h"
#include "mhla/line_aligned.hpp"

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
// Whole vectors: the row's padding is zero in the state and in `values`.
template <int V>
HWY_INLINE void Row(int64_t a, int64_t row, int64_t j0, const float* kap, const VecF (&values)[V],
                    const float* u, VecF w, const float* prefix, float* running, VecF (&sum)[V]) {
  const Tag d;
  const size_t lanes = hn::Lanes(d);
  const VecF ka = hn::Set(d, kap[a]), ua = hn::Set(d, u[a]);
  float* run = running + a * row + j0;
  const float* pre = prefix + a * row + j0;
#pragma GCC unroll 4
  for (int i = 0; i < V; ++i) {
    const VecF r = hn::MulAdd(ka, values[i], hn::LoadU(d, run + i * lanes));
    hn::StoreU(r, d, run + i * lanes);
    sum[i] = hn::MulAdd(ua, hn::MulAdd(w, r, hn::LoadU(d, pre + i * lanes)), sum[i]);
  }
}

// Columns [j0, j0 + V lanes) of y; the last vector holds `tail` of them.
template <int V>
HWY_INLINE void Columns(const StateLayout& layout, int64_t j0, size_t tail, const float* kap,
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
    values[i] = i == V - 1 ? LoadFirst(v + j0 + i * lanes, tail) : hn::LoadU(d, v + j0 + i * lanes);
    even[i] = odd[i] = hn::Zero(d);
  }
  const int64_t dk = layout.dk, row = layout.row;
  int64_t a = 0;
  for (; a + 1 < dk; a += 2) {
    Row<V>(a, row, j0, kap, values, u, w, prefix, running, even);
    Row<V>(a + 1, row, j0, kap, values, u, w, prefix, running, odd);
  }
  if (a < dk) Row<V>(a, row, j0, kap, values, u, w, prefix, running, even);
#pragma GCC unroll 4
  for (int i = 0; i < V; ++i) {
    const VecF total = hn::Add(even[i], odd[i]);
    if (i == V - 1)
      StoreFirst(total, y + j0 + i * lanes, tail);
    else
      hn::StoreU(total, d, y + j0 + i * lanes);
  }
}

// The key sums z: running_z += kap, and the denominator sum_a u[a] (prefix_z[a] + wii
// running_z[a]).
HWY_INLINE float KeySums(int64_t dk, const float* kap, const float* u, float wii,
                         const float* prefix_z, float* running_z) {
  const Tag d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const VecF w = hn::Set(d, wii);
  VecF den = hn::Zero(d);
  for (int64_t a = 0; a < dk; a += lanes) {
    // kap and u hold exactly Dk floats; z's padding is zero and stays so.
    const size_t n = size_t(std::min(lanes, dk - a));
    const VecF r = hn::Add(hn::LoadU(d, running_z + a), LoadFirst(kap + a, n));
    hn::StoreU(r, d, running_z + a);
    den = hn::MulAdd(LoadFirst(u + a, n), hn::MulAdd(w, r, hn::LoadU(d, prefix_z + a)), den);
  }
  return hn::GetLane(hn::SumOfLanes(d, den));
}

float DecodeTokenImpl(const StateLayout& layout, const float* kap, const float* v, const float* u,
                      float wii, const float* prefix, float* running, float* y) {
  const int64_t dv = layout.dv, lanes = int64_t(hn::Lanes(Tag()));
  const int64_t panel = kMaxVectors * lanes;
  for (int64_t j0 = 0; j0 < dv; j0 += panel) {
    const int64_t cols = std::min(panel, dv - j0);
    const int vectors = int((cols + lanes - 1) / lanes);
    const size_t tail = size_t(cols - (vectors - 1) * lanes);
    // Whole vectors of a row stay inside it: the row is a multiple of 16 floats.
    switch (vectors) {
      case 1:
        Columns<1>(layout, j0, tail, kap, v, u, wii, prefix, running, y);
        break;
      case 2:
        Columns<2>(layout, j0, tail, kap, v, u, wii, prefix, running, y);
        break;
      default:
        if constexpr (kMaxVectors >= 4) {
          if (vectors == 3)
            Columns<3>(layout, j0, tail, kap, v, u, wii, prefix, running, y);
          else
            Columns<4>(layout, j0, tail, kap, v, u, wii, prefix, running, y);
        }
    }
  }
  const int64_t z = layout.dk * layout.row;
  return KeySums(layout.dk, kap, u, wii, prefix + z, running + z);
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

StateLayout::StateLayout(int64_t dk_, int64_t dv_)
    : dk(dk_),
      dv(dv_),
      row(mhla::detail::round_up(dv_, 16)),
      z_floats(mhla::detail::round_up(dk_, 16)),
      floats(dk_ * row + z_floats) {}

void StateLayout::store(const float* summary, float* stored) const {
  std::fill(stored, stored + floats, 0.0f);
  for (int64_t a = 0; a < dk; ++a) {
    std::copy(summary + a * (dv + 1), summary + a * (dv + 1) + dv, stored + a * row);
    stored[dk * row + a] = summary[a * (dv + 1) + dv];
  }
}

void StateLayout::load(const float* stored, float* summary) const {
  for (int64_t a = 0; a < dk; ++a) {
    std::copy(stored + a * row, stored + a * row + dv, summary + a * (dv + 1));
    summary[a * (dv + 1) + dv] = stored[dk * row + a];
  }
}

HWY_EXPORT(DecodeTokenImpl);

float decode_token(const StateLayout& layout, const float* kap, const float* v, const float* u,
                   float wii, const float* prefix, float* running, float* y) {
  return HWY_DYNAMIC_DISPATCH(DecodeTokenImpl)(layout, kap, v, u, wii, prefix, running, y);
}

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
