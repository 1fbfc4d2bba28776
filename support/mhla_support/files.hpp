#pragma once
// File reads that never take more than a file announces, and crash-safe
// writes, with errors that name the path.
#include <cstdint>
#include <string>
#include <vector>

namespace mhla::io {

// A regular file opened for reading. Anything else (a FIFO, a device such as
// /dev/zero, a directory) is refused by name at once: it has no size to check
// a header against and may never end. Readers take the magic and header
// first, check the size they announce against size(), and only then read the
// payload.
class InputFile {
 public:
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Bytes [offset, offset + count); mhla::Error unless all of them are there.
  std::vector<uint8_t> read(uint64_t offset, uint64_t count) const;
  // The first min(count, size()) bytes: a magic number and header to check.
  std::vector<uint8_t> head(uint64_t count) const;
  std::vector<uint8_t> read_all() const { return read(0, size_); }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// mhla::Error naming the path unless it names a regular file (for readers
// that open it through another library).
void require_regular_file(const std::string& path);

// A name for a temporary file beside `path` ("path.<pid>-<n>.partial") that no
// other thread or process uses, so writers of the same path (two comparisons
// sharing an output folder) never write into each other's temporary file.
std::string temporary_path_beside(const std::string& path, const std::string& suffix = ".partial");

// Writes to a temporary file beside `path`, then renames it over `path`, so a
// failure part-way never leaves a truncated file where a good one was, and
// concurrent writers leave one of their files whole.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace mhla::io
