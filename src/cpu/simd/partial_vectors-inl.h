// Per-target pieces shared by the SIMD kernels: the float vector type and
// loads/stores of a partial vector. A Highway "-inl" header: each kernel
// re-includes it once per target (the guard toggles with HWY_TARGET_TOGGLE).
#if defined(MHLA_CPU_SIMD_PARTIAL_VECTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHLA_CPU_SIMD_PARTIAL_VECTORS_INL_H_
#undef MHLA_CPU_SIMD_PARTIAL_VECTORS_INL_H_
#else
#define MHLA_CPU_SIMD_PARTIAL_VECTORS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using Tag = hn::ScalableTag<float>;
using VecF = hn::Vec<Tag>;

// A partial vector of the first n lanes at p (the rest zero), and its store:
// through an aligned stack copy, because Highway's masked loads and stores on
// SSE4 and older read and write whole vectors (past the end of a buffer).
HWY_INLINE VecF LoadFirst(const float* p, size_t n) {
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)] = {};
  std::memcpy(lanes, p, n * sizeof(float));
  return hn::Load(Tag(), lanes);
}
HWY_INLINE void StoreFirst(VecF v, float* p, size_t n) {
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, Tag(), lanes);
  std::memcpy(p, lanes, n * sizeof(float));
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#endif  // MHLA_CPU_SIMD_PARTIAL_VECTORS_INL_H_
