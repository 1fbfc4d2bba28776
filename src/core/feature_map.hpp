#pragma once
// phi and its derivative, shared by the references and the fast kernels so that
// both apply exactly the same function.
#include <algorithm>

#include "mhla/options.hpp"
#include "mhla_support/vector_math.hpp"

namespace mhla::detail {

// Branch-free per-map versions: loops over them vectorise (exp included).
template <FeatureMap Phi, typename T>
inline T apply_feature(T x) {
  if constexpr (Phi == FeatureMap::relu) return std::max(x, T(0));
  if constexpr (Phi == FeatureMap::elu1) {
    // exp is evaluated on both sides of the select, on min(x, 0) so it cannot overflow.
    const T e = vector_exp(std::min(x, T(0)));
    return x > T(0) ? x + T(1) : e;
  }
  return x;
}

// d phi / dx. relu uses 0 at x = 0 (the subgradient PyTorch uses).
template <FeatureMap Phi, typename T>
inline T apply_feature_derivative(T x) {
  if constexpr (Phi == FeatureMap::relu) return x > T(0) ? T(1) : T(0);
  if constexpr (Phi == FeatureMap::elu1) {
    const T e = vector_exp(std::min(x, T(0)));
    return x > T(0) ? T(1) : e;
  }
  return T(1);
}

// phi'(x) recovered from y = phi(x), so kernels that hold phi(x) need neither x
// nor another exp: elu+1 has y = x + 1 > 1 for x > 0 and y = exp(x) <= 1
// otherwise, hence phi'(x) = min(y, 1); relu has phi'(x) = [y > 0].
template <FeatureMap Phi, typename T>
inline T derivative_from_feature(T y) {
  if constexpr (Phi == FeatureMap::relu) return y > T(0) ? T(1) : T(0);
  if constexpr (Phi == FeatureMap::elu1) return std::min(y, T(1));
  return T(1);
}

// Calls fn.template operator()<Phi>() with the feature map as a compile-time
// constant, so the per-element code contains no switch.
template <typename Fn>
inline decltype(auto) dispatch_feature(FeatureMap phi, Fn&& fn) {
  switch (phi) {
    case FeatureMap::relu:
      return fn.template operator()<FeatureMap::relu>();
    case FeatureMap::elu1:
      return fn.template operator()<FeatureMap::elu1>();
    case FeatureMap::identity:
      break;
  }
  return fn.template operator()<FeatureMap::identity>();
}

template <typename T>
inline T feature(FeatureMap phi, T x) {
  return dispatch_feature(phi, [&]<FeatureMap Phi>() { return apply_feature<Phi>(x); });
}

template <typename T>
inline T feature_derivative(FeatureMap phi, T x) {
  return dispatch_feature(phi, [&]<FeatureMap Phi>() { return apply_feature_derivative<Phi>(x); });
}

}  // namespace mhla::detail
