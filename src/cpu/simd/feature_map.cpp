// Highway compiles this file once per target instruction set (see
// block_gemm.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/feature_map.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include "core/feature_map.hpp"
#include "cpu/simd/feature_map.hpp"

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
using Tag = hn::ScalableTag<float>;
using VecF = hn::Vec<Tag>;

// elu(x) + 1: x + 1 above zero, exp(x) elsewhere, NaN kept. exp(t) for
// t = min(max(x, -104), 0) (exp rounds to 0 below -104 in float) is
// 2^n exp(r), n = round(t / ln 2), |r| <= ln(2) / 2, with
// exp(r) = 1 + r + r^2 P(r), the polynomial of Highway's Exp (within 1 ulp);
// vscalefps applies 2^n in one step, rounding once into the subnormals.
// vminps / vmaxps return their second operand when either is NaN, so NaN
// runs through every step as NaN.
HWY_INLINE VecF Elu1(VecF x) {
  const Tag d;
  const __m512 t =
      _mm512_min_ps(_mm512_setzero_ps(), _mm512_max_ps(_mm512_set1_ps(-104.0f), x.raw));
  const VecF n{_mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
  VecF r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), VecF{t});
  r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
  VecF p = hn::Set(d, 0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  const VecF e = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
  const VecF exp_t{_mm512_scalef_ps(e.raw, n.raw)};
  return hn::IfThenElse(hn::Gt(x, hn::Zero(d)), hn::Add(x, hn::Set(d, 1.0f)), exp_t);
}

void Elu1Rows(const float* src, int64_t ld_src, float* tile, int64_t rows, int64_t width,
              int64_t ld) {
  const Tag d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ld_src;
    float* y = tile + r * ld;
    int64_t c = 0;
    for (; c + lanes <= width; c += lanes) hn::StoreU(Elu1(hn::LoadU(d, x + c)), d, y + c);
    if (c < width) {
      const auto mask = hn::FirstN(d, size_t(width - c));
      hn::BlendedStore(Elu1(hn::MaskedLoad(mask, d, x + c)), mask, d, y + c);
    }
  }
}
#endif

template <FeatureMap Phi>
void FeatureRows(const float* src, int64_t ld_src, float* tile, int64_t rows, int64_t width,
                 int64_t ld) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (Phi == FeatureMap::elu1) return Elu1Rows(src, ld_src, tile, rows, width, ld);
#endif
  // Elsewhere the shared per-element functions, whose exp is glibc's vector
  // expf (a table and a short polynomial): on AVX2 0.30 ns an element, where
  // the form above took 0.41.
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ld_src;
    float* y = tile + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) y[c] = mhla::detail::apply_feature<Phi>(x[c]);
  }
}

void ApplyFeatureImpl(FeatureMap phi, const float* src, int64_t ld_src, float* tile, int64_t rows,
                      int64_t width, int64_t ld) {
  mhla::detail::dispatch_feature(
      phi, [&]<FeatureMap Phi>() { FeatureRows<Phi>(src, ld_src, tile, rows, width, ld); });
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

HWY_EXPORT(ApplyFeatureImpl);

void apply_feature(FeatureMap phi, const float* src, int64_t ld_src, float* tile, int64_t rows,
                   int64_t width, int64_t ld) {
  if (rows <= 0 || width <= 0) return;
  HWY_DYNAMIC_DISPATCH(ApplyFeatureImpl)(phi, src, ld_src, tile, rows, width, ld);
}

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
