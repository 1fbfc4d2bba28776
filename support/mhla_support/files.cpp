#include "mhla_support/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mhla/error.hpp"

namespace mhla::io {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error(what + " '" + path + "': " + std::strerror(errno));
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void not_regular(const std::string& path, mode_t mode) {
  throw Error("'" + path + "' is " + kind_of(mode) +
              ", not a regular file; save the data to a file and pass that");
}

}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO that no one writes would otherwise wait
  // forever before fstat could refuse it. Regular files ignore the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open", path);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int saved = errno;
    ::close(fd_);
    errno = saved;
    fail("cannot read", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    not_regular(path, st.st_mode);
  }
  size_ = uint64_t(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

std::vector<uint8_t> InputFile::read(uint64_t offset, uint64_t count) const {
  if (offset > size_ || count > size_ - offset)
    throw Error("'" + path_ + "' holds " + std::to_string(size_) + " bytes; reading " +
                std::to_string(count) + " from byte " + std::to_string(offset) +
                " runs past its end (truncated file)");
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  uint64_t done = 0;
  while (done < count) {
    const ssize_t got =
        ::pread(fd_, bytes.data() + done, size_t(count - done), off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail("cannot read", path_);
    if (got == 0)
      throw Error("'" + path_ + "' ended after " + std::to_string(offset + done) +
                  " bytes while it was read (changed by another process?)");
    done += uint64_t(got);
  }
  return bytes;
}

std::vector<uint8_t> InputFile::head(uint64_t count) const {
  return read(0, std::min(count, size_));
}

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot open", path);
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
}

std::string temporary_path_beside(const std::string& path, const std::string& suffix) {
  static std::atomic<uint64_t> count{0};
  return path + "." + std::to_string(::getpid()) + "-" + std::to_string(count++) + suffix;
}

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = temporary_path_beside(path);
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
