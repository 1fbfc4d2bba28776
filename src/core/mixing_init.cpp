#include "mhla/mixing_init.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/allocation.hpp"
#include "mhla/error.hpp"
#include "mhla_support/checked_math.hpp"
#include "mhla_support/parse_enum.hpp"

namespace mhla {
namespace {

// Centre of block b on the block grid, in block units.
std::array<double, 3> block_centre(const TokenLayout& layout, int64_t b) {
  const auto& g = layout.block_grid();
  return {double(b / (g[1] * g[2])) + 0.5, double((b / g[2]) % g[1]) + 0.5, double(b % g[2]) + 0.5};
}

double distance(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  const double dt = a[0] - b[0], dh = a[1] - b[1], dw = a[2] - b[2];
  return std::sqrt(dt * dt + dh * dh + dw * dw);
}

double transform(const MixingInit& init, double d, double dmax) {
  // With one block dmax is 0; every transform then gives the single weight 1.
  const double ratio = dmax > 0 ? d / dmax : 0.0;
  switch (init.transform) {
    case MixingTransform::linear:
      return 1.0 - ratio;
    case MixingTransform::cosine:
      return std::cos(ratio * std::numbers::pi / 4);
    case MixingTransform::exp:
      return std::exp(-d / init.sigma);
    case MixingTransform::gaussian: {
      if (dmax == 0) return 1.0;
      const double s = dmax / 3;
      return std::exp(-d * d / (2 * s * s));
    }
    case MixingTransform::local:
      return d <= init.threshold ? 1.0 : 0.0;
    case MixingTransform::uniform:
      return 1.0;
  }
  return 1.0;
}

void check_transform(const char* fn, const MixingInit& init) {
  if (init.transform == MixingTransform::exp && !(init.sigma > 0))
    throw Error(std::string(fn) + ": sigma must be positive for the exp transform, got " +
                std::to_string(init.sigma));
  if (init.transform == MixingTransform::local && !(init.threshold >= 0))
    throw Error(std::string(fn) + ": threshold must be >= 0 for the local transform, got " +
                std::to_string(init.threshold));
}

}  // namespace

std::vector<float> init_mixing(const TokenLayout& layout, const MixingInit& init) {
  if (layout.empty()) throw Error("init_mixing: layout is not set");
  check_transform("init_mixing", init);
  const int64_t m = layout.num_blocks();
  if (m > kMaxDenseMixingBlocks)
    throw Error("init_mixing: " + layout.describe() +
                ": a dense M x M mixing matrix is limited to M <= " +
                std::to_string(kMaxDenseMixingBlocks) +
                " (256 MiB in float32; the paper keeps M^2 <= N, "
                "so that covers 67M tokens). Use larger blocks, or Toeplitz mixing, which has no "
                "such limit");

  double dmax = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < m; ++b)
      dmax = std::max(dmax, distance(block_centre(layout, i), block_centre(layout, b)));

  std::vector<float> w = detail::allocating(
      "init_mixing", "the [" + std::to_string(m) + ", " + std::to_string(m) + "] mixing matrix",
      double(m) * double(m) * sizeof(float),
      [&] { return std::vector<float>(size_t(m * m), 0.0f); });
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

std::vector<float> init_toeplitz_mixing(int64_t length, const MixingInit& init) {
  check_transform("init_toeplitz_mixing", init);
  if (length < 0)
    throw Error("init_toeplitz_mixing: length L must be >= 0, got " + std::to_string(length));
  std::vector<float> w = detail::allocating(
      "init_toeplitz_mixing",
      "the Toeplitz mixing vector of L + 1 = " + std::to_string(length) + " + 1 entries",
      (double(length) + 1) * sizeof(float), [&] { return std::vector<float>(size_t(length) + 1); });
  for (int64_t d = 0; d <= length; ++d) w[d] = float(transform(init, double(d), double(length)));
  return w;
}

std::vector<float> toeplitz_to_dense(TensorView<const float> w, int64_t blocks) {
  const char* fn = "mhla::toeplitz_to_dense";
  if (w.shape.size() != 1 && w.shape.size() != 2)
    throw Error(std::string(fn) + ": w must have shape [L + 1] or [H, L + 1], got " +
                shape_to_string(w.shape));
  if (w.data == nullptr || w.shape.back() <= 0 || w.shape.front() <= 0)
    throw Error(std::string(fn) + ": w of shape " + shape_to_string(w.shape) + " is empty or null");
  if (blocks <= 0 || blocks > kMaxDenseMixingBlocks)
    throw Error(std::string(fn) + ": blocks must be in [1, " +
                std::to_string(kMaxDenseMixingBlocks) + "] (the dense mixing limit), got " +
                std::to_string(blocks));
  const int64_t copies = w.shape.size() == 2 ? w.shape[0] : 1, length = w.shape.back() - 1;
  const int64_t count =
      detail::checked_product({copies, blocks, blocks}, std::string(fn) + ": the dense matrix");
  std::vector<float> dense = detail::allocating(
      fn,
      "the dense mixing matrix of " + shape_to_string(w.shape) + " over " + std::to_string(blocks) +
          " blocks",
      double(count) * sizeof(float), [&] { return std::vector<float>(size_t(count), 0.0f); });
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t i = 0; i < blocks; ++i)
      for (int64_t b = 0; b <= i; ++b)
        dense[(c * blocks + i) * blocks + b] = w.data[c * (length + 1) + std::min(i - b, length)];
  return dense;
}

MixingTransform parse_mixing_transform(const std::string& name) {
  return detail::parse_enum(
      name, "mixing transform",
      {MixingTransform::linear, MixingTransform::cosine, MixingTransform::exp,
       MixingTransform::gaussian, MixingTransform::local, MixingTransform::uniform});
}

const char* to_string(MixingTransform transform) {
  switch (transform) {
    case MixingTransform::linear:
      return "linear";
    case MixingTransform::cosine:
      return "cos";
    case MixingTransform::exp:
      return "exp";
    case MixingTransform::gaussian:
      return "gaussian";
    case MixingTransform::local:
      return "local";
    case MixingTransform::uniform:
      return "uniform";
  }
  return "?";
}

}  // namespace mhla
