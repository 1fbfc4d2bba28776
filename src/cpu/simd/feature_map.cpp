// Highway compiles this file once per target instruction set (see
// block_gemm.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/feature_map.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include "core/feature_map.hpp"
#include "cpu/simd/elu1_avx512.hpp"
#include "cpu/simd/feature_map.hpp"
#include "cpu/simd/prefetch.hpp"

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
using Tag = hn::ScalableTag<float>;
using VecF = hn::Vec<Tag>;

// elu(x) + 1 (cpu/simd/elu1_avx512.hpp).
HWY_INLINE VecF Elu1(VecF x) { return VecF{elu1_avx512(x.raw)}; }

void Elu1Rows(const float* src, int64_t ld_src, float* tile, int64_t rows, int64_t width,
              int64_t ld) {
  const Tag d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ld_src;
    // Beside the lines requested during the product before (RowLines): it
    // helps mhla_bench's forward at its largest N.
    prefetch_ahead(x, ld_src, width);
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
  // expf (a table and a short polynomial), on AVX2 faster than the form above.
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
