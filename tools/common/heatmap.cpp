#include "common/heatmap.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>

#include "mhla/error.hpp"
#include "mhla_support/files.hpp"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

namespace mhla::tools {
namespace {

// Samples of the viridis colour map at 0, 0.25, 0.5, 0.75 and 1.
constexpr std::array<std::array<double, 3>, 5> kStops = {
    {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};

std::array<uint8_t, 3> colour(double t) {
  t = std::clamp(t, 0.0, 1.0) * double(kStops.size() - 1);
  const size_t i = std::min(size_t(t), kStops.size() - 2);
  const double f = t - double(i);
  std::array<uint8_t, 3> rgb{};
  for (int c = 0; c < 3; ++c)
    rgb[c] = uint8_t(std::lround(kStops[i][c] * (1 - f) + kStops[i + 1][c] * f));
  return rgb;
}

}  // namespace

void write_heatmap_png(const std::string& path, const std::vector<double>& matrix, int64_t rows,
                       int64_t cols, bool overwrite) {
  if (rows <= 0 || cols <= 0 || int64_t(matrix.size()) != rows * cols)
    throw Error(path + ": heatmap needs a non-empty rows x cols matrix");
  if (!overwrite && std::filesystem::exists(path))
    throw Error(path + ": already exists; refusing to overwrite it (pass --force)");
  // Source cells per pixel (averaged) or pixels per cell (repeated).
  const int64_t longest = std::max(rows, cols);
  const int64_t shrink = (longest + 511) / 512;
  const int64_t grow = std::max<int64_t>(1, 256 / longest);
  const int64_t h = (rows + shrink - 1) / shrink * grow, w = (cols + shrink - 1) / shrink * grow;
  std::vector<double> cells(size_t((h / grow) * (w / grow)), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      cells[size_t((r / shrink) * (w / grow) + c / shrink)] += matrix[r * cols + c];
  const double top = *std::max_element(cells.begin(), cells.end());
  std::vector<uint8_t> pixels(size_t(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const double v = cells[size_t((y / grow) * (w / grow) + x / grow)];
      const auto rgb = colour(top > 0 ? std::sqrt(std::max(v, 0.0) / top) : 0.0);
      std::copy(rgb.begin(), rgb.end(), pixels.begin() + (y * w + x) * 3);
    }
  // Encoded in memory so that the one atomic writer puts it in place.
  std::vector<uint8_t> png;
  const auto append = [](void* out, void* data, int size) {
    auto& bytes = *static_cast<std::vector<uint8_t>*>(out);
    const auto* chunk = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), chunk, chunk + size);
  };
  if (!stbi_write_png_to_func(append, &png, int(w), int(h), 3, pixels.data(), int(w * 3)))
    throw Error(path + ": cannot encode the PNG image");
  io::write_file_atomically(path, png);
}

}  // namespace mhla::tools
