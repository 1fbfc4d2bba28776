#pragma once
// NumPy .npy files (format versions 1.0, 2.0 and 3.0): little-endian float32
// or float64, C order. The reader treats its input as untrusted and reports
// every problem as an mhla::Error naming the file and what is wrong.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace mhla::tools {

enum class DType { f32, f64 };
const char* to_string(DType dtype);

struct NpyArray {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<double> values;  // widened from float32 exactly
  int64_t size() const { return int64_t(values.size()); }
};

// Parses a whole .npy file held in memory; `source` names it in errors.
NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& source);
NpyArray read_npy(const std::string& path);

// A .npz archive (NumPy's savez / savez_compressed): every member "NAME.npy".
std::map<std::string, NpyArray> read_npz(const std::string& path);

// Version 1.0 (2.0 if the header needs it), header padded to 64 bytes. Refuses
// to replace an existing file unless overwrite is set; writes atomically.
void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
               const std::vector<double>& values, bool overwrite);
std::vector<uint8_t> encode_npy(DType dtype, const std::vector<int64_t>& shape,
                                const std::vector<double>& values);

}  // namespace mhla::tools
