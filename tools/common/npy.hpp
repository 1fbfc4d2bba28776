#pragma once
// NumPy .npy files (format versions 1.0, 2.0 and 3.0): little-endian float32
// or float64, C order. The reader treats its input as untrusted and reports
// every problem as an mhla::Error naming the file and what is wrong. Arrays
// keep the file's own dtype: float32 data is never widened on the way through.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "mhla/error.hpp"

namespace mhla::tools {

enum class DType { f32, f64 };
const char* to_string(DType dtype);

template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

struct NpyArray {
  std::vector<int64_t> shape;
  std::variant<std::vector<float>, std::vector<double>> values;

  DType dtype() const { return values.index() == 0 ? DType::f32 : DType::f64; }
  int64_t size() const;
  // The values as T; T must be the array's dtype (anything else throws).
  template <typename T>
  const std::vector<T>& as() const;
  // The values in double; exact for either dtype. For fp64 analysis and tests.
  std::vector<double> widened() const;
  // An array of `dtype` holding `values`, each rounded to that dtype.
  template <typename U>
  static NpyArray of(DType dtype, std::vector<int64_t> shape, const std::vector<U>& values);
};

// Parses a whole .npy file held in memory; `source` names it in errors.
NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& source);
NpyArray read_npy(const std::string& path);

// A .npz archive (NumPy's savez / savez_compressed): every member "NAME.npy".
std::map<std::string, NpyArray> read_npz(const std::string& path);

// Version 1.0 (2.0 if the header needs it), header padded to 64 bytes, in the
// array's dtype. Refuses to replace an existing file unless overwrite is set;
// writes atomically.
void write_npy(const std::string& path, const NpyArray& array, bool overwrite);
std::vector<uint8_t> encode_npy(const NpyArray& array);

template <typename T>
const std::vector<T>& NpyArray::as() const {
  if (const auto* typed = std::get_if<std::vector<T>>(&values)) return *typed;
  throw Error(std::string("a ") + to_string(dtype()) + " array read as " +
              to_string(dtype_of<T>()));
}

template <typename U>
NpyArray NpyArray::of(DType dtype, std::vector<int64_t> shape, const std::vector<U>& values) {
  if (dtype == DType::f32)
    return {std::move(shape), std::vector<float>(values.begin(), values.end())};
  return {std::move(shape), std::vector<double>(values.begin(), values.end())};
}

}  // namespace mhla::tools
