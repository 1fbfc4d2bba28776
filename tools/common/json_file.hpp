#pragma once
// Writing a benchmark's results as a JSON file.
#include <nlohmann/json.hpp>
#include <string>

namespace mhla::tools {

// Writes `results` (indented) to `path`; on failure prints a one-line error
// naming the file and returns false.
bool write_json_file(const std::string& path, const nlohmann::json& results);

}  // namespace mhla::tools
