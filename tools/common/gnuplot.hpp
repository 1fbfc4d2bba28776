#pragma once
// PNG plots through gnuplot (Debian's gnuplot-nox, pngcairo terminal).
#include <string>
#include <utility>
#include <vector>

namespace mhla::tools {

// Runs `commands` (everything after "set output") with the output set to a
// temporary file that becomes `png` only when gnuplot succeeds. mhla::Error
// naming the plot when gnuplot is missing or fails.
void draw_png_with_gnuplot(const std::string& png, int width, int height,
                           const std::string& commands);

// One gnuplot inline data block named `name` ("$s0") from (x, y) points.
std::string gnuplot_data_block(const std::string& name,
                               const std::vector<std::pair<double, double>>& points);

}  // namespace mhla::tools
