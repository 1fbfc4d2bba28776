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
// t = min(max(x, -104), 0) (exp rounds to 0 below -104 in float) is a factor
// near 1 times a power of two, which vscalefps applies in one step, rounding
// once into the subnormals. vminps / vmaxps return their second operand when
// either is NaN, so NaN runs through every step as NaN.

// t, the argument of exp.
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_exp_argument(__m512 x) {
  return _mm512_min_ps(_mm512_setzero_ps(), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
}

// elu(x) + 1 from exp(t) = e 2^floor(n) (vscalefps floors n).
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_from(__m512 x, __m512 e,
                                                                          __m512 n) {
  const __m512 exp_t = _mm512_scalef_ps(e, n);
  const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_mask_add_ps(exp_t, positive, x, _mm512_set1_ps(1.0f));
}

// To float precision (within 1.07 ulp of the exact value on every float input
// from 0 down to -110; the form with Highway's Exp polynomial, within 0.99,
// is slower): exp(t) = 2^(k / 16) exp(r) with k = round(16 t / ln 2),
// from the add-and-subtract rounding, and |r| <= ln(2) / 32 from two steps
// (ln(2) / 16 as a sum of two floats). 2^(j / 16) for j = k mod 16 comes from
// a table of 16 (vpermps reads the low four bits of the rounded value's
// pattern, which hold k mod 16), 2^floor(k / 16) from vscalefps (which floors
// the exponent it is given), and exp(r) - 1 from r + r^2 / 2 + r^3 / 6 (the
// next term is under 1e-8 relatively).
__attribute__((target("avx512f"), always_inline)) inline __m512 elu1_avx512(__m512 x) {
  const __m512 t = elu1_exp_argument(x);
  const __m512 shifter = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23: rounds to an integer
  const __m512 rounded = _mm512_fmadd_ps(t, _mm512_set1_ps(23.083120346069336f), shifter);
  const __m512 k = _mm512_sub_ps(rounded, shifter);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.043321698904037476f), t);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-1.1904088825787085e-10f), r);
  const __m512 powers = _mm512_setr_ps(
      1.0f, 1.0442737340927124f, 1.0905077457427979f, 1.1387885808944702f, 1.1892070770263672f,
      1.2418577671051025f, 1.2968395948410034f, 1.3542555570602417f, 1.4142135381698608f,
      1.4768261909484863f, 1.5422108173370361f, 1.610490322113037f, 1.6817928552627563f,
      1.7562521696090698f, 1.8340080976486206f, 1.9152065515518188f);
  const __m512 power = _mm512_permutexvar_ps(_mm512_castps_si512(rounded), powers);
  __m512 q = _mm512_fmadd_ps(r, _mm512_set1_ps(0.1666666716337204f), _mm512_set1_ps(0.5f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  q = _mm512_mul_ps(q, r);
  const __m512 e = _mm512_fmadd_ps(power, q, power);  // 2^(j / 16) exp(r), rounded once
  return elu1_from(x, e, _mm512_mul_ps(k, _mm512_set1_ps(0.0625f)));
}

// elu(x) + 1 for values about to be rounded to bfloat16 (the bfloat16
// operator's features): within 5.5e-6 of it relatively on every bfloat16
// input (tested), against bfloat16's half step of 2^-9 = 2.0e-3, so the
// rounding changes at most where a value lies that close to a midpoint. n
// comes from the add-and-subtract rounding, r from one step with ln(2)
// rounded to float (|n| <= 151: under 3e-7 more), and exp(r) from
// 1 + r + r^2 (c2 + c3 r + c4 r^2), fitted for least relative error on that
// interval: fewer steps than the float-precision form of Highway's Exp
// polynomial (seven multiply-adds).
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
