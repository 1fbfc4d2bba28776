#include "mhla/mixing_init.hpp"

#include <cmath>
#include <numbers>

#include "mhla/error.hpp"

namespace mhla {
namespace {

// Centre of block b on the block grid, in block units.
std::array<double, 3> block_centre(const TokenLayout& layout, int64_t b) {
  const auto& g = layout.block_grid();
  return {double(b / (g[1] * g[2])) + 0.5, double((b / g[2]) % g[1]) + 0.5,
          double(b % g[2]) + 0.5};
}

double distance(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  const double dt = a[0] - b[0], dh = a[1] - b[1], dw = a[2] - b[2];
  return std::sqrt(dt * dt + dh * dh + dw * dw);
}

double transform(const MixingInit& init, double d, double dmax) {
  // With one block dmax is 0; every transform then gives the single weight 1.
  const double ratio = dmax > 0 ? d / dmax : 0.0;
  switch (init.transform) {
    case MixingTransform::linear: return 1.0 - ratio;
    case MixingTransform::cosine: return std::cos(ratio * std::numbers::pi / 4);
    case MixingTransform::exp: return std::exp(-d / init.sigma);
    case MixingTransform::gaussian: {
      if (dmax == 0) return 1.0;
      const double s = dmax / 3;
      return std::exp(-d * d / (2 * s * s));
    }
    case MixingTransform::local: return d <= init.threshold ? 1.0 : 0.0;
    case MixingTransform::uniform: return 1.0;
  }
  return 1.0;
}

}  // namespace

std::vector<float> init_mixing(const TokenLayout& layout, const MixingInit& init) {
  if (layout.empty()) throw Error("init_mixing: layout is not set");
  if (init.transform == MixingTransform::exp && !(init.sigma > 0))
    throw Error("init_mixing: sigma must be positive for the exp transform, got " +
                std::to_string(init.sigma));
  if (init.transform == MixingTransform::local && !(init.threshold >= 0))
    throw Error("init_mixing: threshold must be >= 0 for the local transform, got " +
                std::to_string(init.threshold));
  const int64_t m = layout.num_blocks();
  if (m > 65536)
    throw Error("init_mixing: " + std::to_string(m) +
                " blocks would need an M x M matrix of more than 2^32 entries");

  double dmax = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < m; ++b)
      dmax = std::max(dmax, distance(block_centre(layout, i), block_centre(layout, b)));

  std::vector<float> w(size_t(m * m), 0.0f);
  std::vector<double> row(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t last = init.causal ? i : m - 1;
    double sum = 0;
    for (int64_t b = 0; b <= last; ++b) {
      row[b] = transform(init, distance(block_centre(layout, i), block_centre(layout, b)), dmax);
      sum += row[b];
    }
    // sum > 0: every transform gives the block itself (d = 0) a positive weight.
    for (int64_t b = 0; b <= last; ++b) w[i * m + b] = float(row[b] / sum);
  }
  return w;
}

MixingTransform parse_mixing_transform(const std::string& name) {
  for (auto t : {MixingTransform::linear, MixingTransform::cosine, MixingTransform::exp,
                 MixingTransform::gaussian, MixingTransform::local, MixingTransform::uniform})
    if (name == to_string(t)) return t;
  throw Error("unknown mixing transform '" + name +
              "'; expected linear, cos, exp, gaussian, local or uniform");
}

const char* to_string(MixingTransform transform) {
  switch (transform) {
    case MixingTransform::linear: return "linear";
    case MixingTransform::cosine: return "cos";
    case MixingTransform::exp: return "exp";
    case MixingTransform::gaussian: return "gaussian";
    case MixingTransform::local: return "local";
    case MixingTransform::uniform: return "uniform";
  }
  return "?";
}

}  // namespace mhla
