#include "common/gnuplot.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mhla/error.hpp"
#include "mhla_support/files.hpp"

namespace mhla::tools {

void draw_png_with_gnuplot(const std::string& png, int width, int height,
                           const std::string& commands) {
  const std::string partial = io::temporary_path_beside(png),
                    script = io::temporary_path_beside(png, ".gp");
  {
    std::ofstream out(script);
    out << "set terminal pngcairo size " << width << "," << height << "\nset output '" << partial
        << "'\n"
        << commands << "\n";
    if (!out) throw Error(script + ": cannot write");
  }
  const std::string command = "gnuplot '" + script + "' 2>&1";
  const bool ok = std::system(command.c_str()) == 0 && std::filesystem::exists(partial);
  std::filesystem::remove(script);
  if (!ok) {
    std::filesystem::remove(partial);
    throw Error("gnuplot could not draw " + png + " (apt-get install gnuplot-nox)");
  }
  std::filesystem::rename(partial, png);
}

std::string gnuplot_data_block(const std::string& name,
                               const std::vector<std::pair<double, double>>& points) {
  std::string block = name + " << EOD\n";
  char line[64];
  for (const auto& [x, y] : points) {
    std::snprintf(line, sizeof line, "%.9g %.9g\n", x, y);
    block += line;
  }
  return block + "EOD\n";
}

}  // namespace mhla::tools
