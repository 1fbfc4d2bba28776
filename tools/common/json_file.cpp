#include "common/json_file.hpp"

#include <cstdio>

#include "mhla/error.hpp"
#include "mhla_support/files.hpp"

namespace mhla::tools {

bool write_json_file(const std::string& path, const nlohmann::json& results) {
  const std::string text = results.dump(2) + "\n";
  try {
    io::write_file_atomically(path, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: cannot write %s: %s\n", path.c_str(), e.what());
    return false;
  }
  return true;
}

nlohmann::json read_json_file(const std::string& path) {
  const std::vector<uint8_t> bytes = io::InputFile(path).read_all();
  nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (j.is_discarded()) throw Error(path + ": not valid JSON");
  return j;
}

}  // namespace mhla::tools
