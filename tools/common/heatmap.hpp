#pragma once
// PNG heatmaps of attention matrices, encoded by stb_image_write.
#include <cstdint>
#include <string>
#include <vector>

namespace mhla::tools {

// Writes the row-major rows x cols matrix (non-negative) as a PNG: values
// divided by the largest, square-rooted so weak structure stays visible, then
// mapped through a viridis-like colour scale (dark = 0, yellow = the maximum).
// Larger matrices are averaged down to at most 512 pixels a side; small ones
// are enlarged by pixel repetition to at least 256. Refuses to replace an
// existing file unless overwrite is set.
void write_heatmap_png(const std::string& path, const std::vector<double>& matrix, int64_t rows,
                       int64_t cols, bool overwrite);

}  // namespace mhla::tools
