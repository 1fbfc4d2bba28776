#include "mhla_support/files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mhla/error.hpp"

namespace mhla::io {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error(what + " '" + path + "': " + std::strerror(errno));
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open", path);
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0)
    bytes.insert(bytes.end(), chunk, chunk + got);
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) fail("cannot read", path);
  return bytes;
}

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = path + ".partial";
  std::FILE* f = std::fopen(temporary.c_str(), "wb");
  if (!f) fail("cannot write", temporary);
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    const int saved = errno;
    std::remove(temporary.c_str());
    errno = saved;
    fail("cannot write", temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    std::remove(temporary.c_str());
    errno = saved;
    fail("cannot rename the written file to", path);
  }
}

}  // namespace mhla::io
