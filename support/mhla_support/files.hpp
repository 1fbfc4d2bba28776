#pragma once
// Whole-file reads and crash-safe writes with errors that name the path.
#include <cstdint>
#include <string>
#include <vector>

namespace mhla::io {

// The file's bytes; mhla::Error naming the path if it cannot be opened or read.
std::vector<uint8_t> read_file(const std::string& path);

// Writes to a temporary file beside `path`, then renames it over `path`, so a
// failure part-way never leaves a truncated file where a good one was.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace mhla::io
