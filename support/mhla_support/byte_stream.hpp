#pragma once
// Little-endian binary encoding for the project's file formats, written out
// byte by byte so files are portable across hosts. The reader treats its input
// as untrusted: every read is bounds-checked and fails with an mhla::Error that
// names the source, the field and the byte offset.
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mhla/error.hpp"

namespace mhla::io {

class ByteWriter {
 public:
  void u8(uint8_t value) { bytes_.push_back(value); }
  void u32(uint32_t value) { put(value, 4); }
  void i64(int64_t value) { put(uint64_t(value), 8); }
  void f64(double value) { put(std::bit_cast<uint64_t>(value), 8); }
  void floats(const float* data, size_t count) {
    bytes_.reserve(bytes_.size() + 4 * count);
    for (size_t i = 0; i < count; ++i) put(std::bit_cast<uint32_t>(data[i]), 4);
  }
  void raw(const char* data, size_t count) { bytes_.insert(bytes_.end(), data, data + count); }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  void put(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(uint8_t(value >> (8 * i)));
  }
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string source)
      : bytes_(bytes), source_(std::move(source)) {}

  uint8_t u8(const char* field) { return uint8_t(get(1, field)); }
  uint32_t u32(const char* field) { return uint32_t(get(4, field)); }
  int64_t i64(const char* field) { return int64_t(get(8, field)); }
  double f64(const char* field) { return std::bit_cast<double>(get(8, field)); }
  // Reads count floats; checks the length before the caller allocates anything.
  std::vector<float> floats(int64_t count, const char* field) {
    require(count, 4, field);
    std::vector<float> out(static_cast<size_t>(count));
    for (float& e : out) e = std::bit_cast<float>(uint32_t(get(4, field)));
    return out;
  }
  void skip(size_t count, const char* field) {
    require(int64_t(count), 1, field);
    offset_ += count;
  }
  // Fails unless count elements of `width` bytes remain (count from the input).
  void require(int64_t count, int64_t width, const char* field) const {
    if (count < 0 || uint64_t(count) > remaining() / uint64_t(width))
      fail(std::string("truncated or inconsistent: '") + field + "' needs " +
           std::to_string(count) + " x " + std::to_string(width) + " bytes, only " +
           std::to_string(remaining()) + " left");
  }
  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(source_ + ": " + message + " (at byte " + std::to_string(offset_) + ")");
  }

 private:
  uint64_t get(int width, const char* field) {
    require(1, width, field);
    uint64_t value = 0;
    for (int i = 0; i < width; ++i) value |= uint64_t(bytes_[offset_ + i]) << (8 * i);
    offset_ += size_t(width);
    return value;
  }
  std::span<const uint8_t> bytes_;
  std::string source_;
  size_t offset_ = 0;
};

}  // namespace mhla::io
