#pragma once
// JSON files of results: benchmark outputs and training metrics.
#include <nlohmann/json.hpp>
#include <string>

namespace mhla::tools {

// Writes `results` (indented) to `path` through a temporary file, so a reader
// never sees half a file; on failure prints a one-line error naming the file
// and returns false.
bool write_json_file(const std::string& path, const nlohmann::json& results);

// The JSON document in `path`; mhla::Error naming the file when it cannot be
// read or is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace mhla::tools
