#pragma once
// elu(x) + 1 on 16 floats with AVX-512: to float precision for the float
// feature kernel (feature_map.cpp), and a shorter form for the bfloat16 one
// (bf16_products.cpp).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// GCC 12 warns that the intrinsics' own _mm512_undefined_* (a register
// initialised from itself, on purpose, whose value no lane keeps) may be used
// uninitialised: a false positive. Off for the two SIMD kernels that include
// this header and use the intrinsics directly.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace mhla::cpu::simd {

// Both forms below: x + 1 above zero, exp(x) elsewhere, NaN kept. exp(t) for
// t = min(max(x, -104), 0) (exp rounds to 0 below -104 in float) is
// 2^n exp(r), n = round(t / ln 2), |r| <= ln(2) / 2; vscalefps applies 2^n
// in one step, rounding once into the subnormals. vminps / vmaxps return
// their second operand when either is NaN, so NaN runs through every step
// as NaN.

// t, the argument of exp.
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_exp_argument(__m512 x) {
  return _mm512_min_ps(_mm512_setzero_ps(), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
}

// elu(x) + 1 from exp(r) = e and n.
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_from(__m512 x, __m512 e,
                                                                          __m512 n) {
  const __m512 exp_t = _mm512_scalef_ps(e, n);
  const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_mask_add_ps(exp_t, positive, x, _mm512_set1_ps(1.0f));
}

// To float precision: exp(r) = 1 + r + r^2 P(r), the polynomial of Highway's
// Exp (within 1 ulp).
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_avx512(__m512 x) {
  const __m512 t = elu1_exp_argument(x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), t);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-6f), r);
  __m512 p = _mm512_set1_ps(0.000198527617612853646278381f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.00139304355252534151077271f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.00833336077630519866943359f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.0416664853692054748535156f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.166666671633720397949219f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return elu1_from(x, e, n);
}

// elu(x) + 1 for values about to be rounded to bfloat16 (the bfloat16
// operator's features): within 5.5e-6 of it relatively on every bfloat16
// input (tested), against bfloat16's half step of 2^-9 = 2.0e-3, so the
// rounding changes at most where a value lies that close to a midpoint. n
// comes from the add-and-subtract rounding, r from one step with ln(2)
// rounded to float (|n| <= 151: under 3e-7 more), and exp(r) from
// 1 + r + r^2 (c2 + c3 r + c4 r^2), fitted for least relative error on that
// interval: three multiply-adds where elu1_avx512 takes seven. On Zen 5,
// 16 Ki values in L1 took 1293 instead of 1967 ns.
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_avx512_for_bf16(__m512 x) {
  const __m512 t = elu1_exp_argument(x);
  const __m512 shifter = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23: rounds to an integer
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(t, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147182464599609375f), t);
  __m512 p = _mm512_set1_ps(0.041277747601270676f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.16753514111042023f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5000511407852173f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return elu1_from(x, e, n);
}

}  // namespace mhla::cpu::simd
#endif
