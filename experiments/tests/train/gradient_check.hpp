#pragma once
// Central finite differences against the trainer's hand-written gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mhla::train::test {

inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = normal(rng);
  return x;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// For up to `samples` entries of `x` (all when fewer), perturbs x[i] by +-h,
// evaluates `loss`, and expects (L+ - L-) / 2h to match analytic[i].
inline void expect_gradient(std::vector<double>& x, const std::vector<double>& analytic,
                            const std::function<double()>& loss, const std::string& what,
                            size_t samples = 48) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> indices(x.size());
  for (size_t i = 0; i < x.size(); ++i) indices[i] = i;
  std::mt19937_64 rng(x.size());
  std::shuffle(indices.begin(), indices.end(), rng);
  indices.resize(std::min(samples, indices.size()));
  double scale = 1e-3;
  for (double g : analytic) scale = std::max(scale, std::abs(g));
  for (size_t i : indices) {
    const double saved = x[i], h = 1e-5 * std::max(1.0, std::abs(saved));
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 1e-6 * scale + 1e-6 * std::abs(numeric))
        << what << " entry " << i;
  }
}

}  // namespace mhla::train::test
