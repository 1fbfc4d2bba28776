#pragma once
// phi and its derivative, shared by the references and the fast kernels so that
// both apply exactly the same function.
#include <cmath>

#include "mhla/options.hpp"

namespace mhla::detail {

template <typename T>
inline T feature(FeatureMap phi, T x) {
  switch (phi) {
    case FeatureMap::relu: return x > T(0) ? x : T(0);
    case FeatureMap::elu1: return x > T(0) ? x + T(1) : std::exp(x);
    case FeatureMap::identity: break;
  }
  return x;
}

// d phi / dx. relu uses 0 at x = 0 (the subgradient PyTorch uses).
template <typename T>
inline T feature_derivative(FeatureMap phi, T x) {
  switch (phi) {
    case FeatureMap::relu: return x > T(0) ? T(1) : T(0);
    case FeatureMap::elu1: return x > T(0) ? T(1) : std::exp(x);
    case FeatureMap::identity: break;
  }
  return T(1);
}

}  // namespace mhla::detail
