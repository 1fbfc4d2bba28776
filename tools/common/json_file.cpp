#include "common/json_file.hpp"

#include <cstdio>
#include <fstream>

namespace mhla::tools {

bool write_json_file(const std::string& path, const nlohmann::json& results) {
  std::ofstream out(path);
  if (out) out << results.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace mhla::tools
