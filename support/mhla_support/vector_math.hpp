#pragma once
// Vectorised exponentials for the elu+1 feature map and the softmax baseline.
//
// glibc's libmvec has AVX2/AVX-512 versions of expf/exp, but <math.h> only
// announces them under -ffast-math, which would also let the compiler assume
// that no value is infinite (the softmax masks with -inf). Declaring the
// vector variants here, and building the library with -fno-math-errno
// -fno-trapping-math (no errno, no FP traps: nothing here reads either), lets
// GCC call them from `omp simd` loops. libmvec is accurate to a few ulp and
// handles inf and NaN like the scalar functions.
#include <cmath>

// Clang (used for the fuzzing build) rejects the redeclaration and does not
// map these loops to libmvec: it keeps the scalar calls.
#if defined(__GNUC__) && !defined(__clang__)
#pragma omp declare simd notinbranch
extern "C" float expf(float) noexcept;
#pragma omp declare simd notinbranch
extern "C" double exp(double) noexcept;
#endif

namespace mhla::detail {

inline float vector_exp(float x) { return expf(x); }
inline double vector_exp(double x) { return exp(x); }

}  // namespace mhla::detail
