#include "common/npy.hpp"

#include <zip.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>

#include "mhla/error.hpp"
#include "mhla/tensor.hpp"
#include "mhla_support/byte_stream.hpp"
#include "mhla_support/checked_math.hpp"
#include "mhla_support/files.hpp"

namespace mhla::tools {
namespace {

constexpr uint8_t kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr size_t kMagicSize = sizeof kMagic;

// The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed strictly: only these three keys, only these value forms.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        descr = quoted();
        seen_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        seen_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        seen_shape = true;
      } else {
        fail("unexpected header key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' in the header");
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the header dict");
    if (!seen_descr || !seen_fortran || !seen_shape)
      fail("the header lacks one of 'descr', 'fortran_order', 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(source_ + ": malformed .npy header: " + message);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string quoted() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    if (s_.compare(pos_, 4, "True") == 0) return pos_ += 4, true;
    if (s_.compare(pos_, 5, "False") == 0) return pos_ += 5, false;
    fail("expected True or False for 'fortran_order'");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> shape;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail("expected a dimension in 'shape'");
      int64_t value = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (__builtin_mul_overflow(value, int64_t(10), &value) ||
            __builtin_add_overflow(value, int64_t(peek() - '0'), &value))
          fail("a dimension in 'shape' overflows 64 bits");
        ++pos_;
      }
      shape.push_back(value);
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;
    if (shape.size() > 32) fail("more than 32 dimensions");
    return shape;
  }

  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;
};

DType dtype_named(const std::string& descr, const std::string& source) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<f8") return DType::f64;
  if (descr == ">f4" || descr == ">f8")
    throw Error(source + ": big-endian data ('" + descr +
                "') is not supported; convert with arr.astype(arr.dtype.newbyteorder('<'))");
  throw Error(source + ": unsupported dtype '" + descr + "' (need float32 '<f4' or float64 '<f8')");
}

}  // namespace

const char* to_string(DType dtype) { return dtype == DType::f32 ? "float32" : "float64"; }

int64_t NpyArray::size() const {
  return std::visit([](const auto& v) { return int64_t(v.size()); }, values);
}

std::vector<double> NpyArray::widened() const {
  return std::visit([](const auto& v) { return std::vector<double>(v.begin(), v.end()); }, values);
}

namespace {

// The largest prefix that holds a .npy file's magic, version and header length.
constexpr size_t kPreambleMax = kMagicSize + 2 + 4;

// Where a .npy file's header dict begins and ends (its data begins there),
// from its first kPreambleMax bytes (fewer if the file is shorter).
struct NpyHeaderSpan {
  uint64_t begin = 0, end = 0;
};
NpyHeaderSpan npy_header_span(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() < kMagicSize + 2 || !std::equal(kMagic, kMagic + kMagicSize, bytes.begin()))
    throw Error(source + ": not a .npy file (no \\x93NUMPY magic)");
  io::ByteReader in(bytes, source);
  in.skip(kMagicSize, "magic");
  const uint8_t major = in.u8("major version"), minor = in.u8("minor version");
  if (major < 1 || major > 3 || minor != 0)
    throw Error(source + ": .npy format version " + std::to_string(major) + "." +
                std::to_string(minor) + " is not supported (1.0, 2.0 and 3.0 are)");
  const uint32_t header_len =
      major == 1 ? uint32_t(in.u8("header length")) | uint32_t(in.u8("header length")) << 8
                 : in.u32("header length");
  return {uint64_t(in.offset()), uint64_t(in.offset()) + header_len};
}

struct NpyHeader {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t count = 0;    // elements
  uint64_t offset = 0;  // where the data begins
  uint64_t bytes = 0;   // of data: count * the dtype's width
};

// The header of a .npy file of `total` bytes, from its first bytes (at least
// up to where the data begins); the data must fill the rest exactly.
NpyHeader parse_npy_header(std::span<const uint8_t> bytes, uint64_t total,
                           const std::string& source) {
  NpyHeader h;
  const NpyHeaderSpan span =
      npy_header_span(bytes.first(std::min(bytes.size(), kPreambleMax)), source);
  h.offset = span.end;
  if (h.offset > total || h.offset > bytes.size())
    throw Error(source + ": truncated .npy header (" + std::to_string(total) +
                " bytes, the header "
                "ends at byte " +
                std::to_string(h.offset) + ")");
  const std::string header(reinterpret_cast<const char*>(bytes.data() + span.begin),
                           size_t(span.end - span.begin));
  std::string descr;
  bool fortran = false;
  HeaderParser(header, source).parse(descr, fortran, h.shape);
  h.dtype = dtype_named(descr, source);
  if (fortran)
    throw Error(source +
                ": Fortran-order data is not supported; save a C-order array "
                "(np.ascontiguousarray)");
  try {
    h.count = detail::checked_product(h.shape, "shape " + shape_to_string(h.shape));
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  const uint64_t width = h.dtype == DType::f32 ? 4 : 8, present = total - h.offset;
  if (present / width < uint64_t(h.count) || present != uint64_t(h.count) * width)
    throw Error(source + ": data holds " + std::to_string(present) + " bytes but shape " +
                shape_to_string(h.shape) + " of " + to_string(h.dtype) + " needs " +
                std::to_string(uint64_t(h.count) * width) + " (truncated or extra data)");
  h.bytes = present;
  return h;
}

// The values of `data`, h.bytes long.
NpyArray npy_values(const NpyHeader& h, std::span<const uint8_t> data, const std::string& source) {
  io::ByteReader in(data, source);
  NpyArray array;
  array.shape = h.shape;
  if (h.dtype == DType::f32) {
    array.values = in.floats(h.count, "data");
  } else {
    std::vector<double> values(static_cast<size_t>(h.count));
    for (double& v : values) v = in.f64("data");
    array.values = std::move(values);
  }
  return array;
}

uint32_t crc32_of(std::span<const uint8_t> bytes) {
  return uint32_t(crc32_z(crc32(0L, Z_NULL, 0), bytes.data(), bytes.size()));
}

}  // namespace

NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& source) {
  const NpyHeader h = parse_npy_header(bytes, bytes.size(), source);
  return npy_values(h, bytes.subspan(size_t(h.offset)), source);
}

NpyArray read_npy(const std::string& path) {
  // Header first: a wrong or endless file is refused before its data is read.
  const io::InputFile file(path);
  const NpyHeaderSpan span = npy_header_span(file.head(kPreambleMax), path);
  // A header said to run past the file's end is refused before it is read.
  const NpyHeader h = parse_npy_header(file.head(span.end <= file.size() ? span.end : kPreambleMax),
                                       file.size(), path);
  return npy_values(h, file.read(h.offset, h.bytes), path);
}

std::map<std::string, NpyArray> read_npz(const std::string& path) {
  // libzip would open a FIFO and wait on it, and read a device without end.
  io::require_regular_file(path);
  int error = 0;
  std::unique_ptr<zip_t, decltype(&zip_discard)> archive(zip_open(path.c_str(), ZIP_RDONLY, &error),
                                                         &zip_discard);
  if (!archive) {
    zip_error_t detail;
    zip_error_init_with_code(&detail, error);
    const std::string message = zip_error_strerror(&detail);
    zip_error_fini(&detail);
    throw Error(path + ": cannot open as a .npz (zip) archive: " + message);
  }
  std::map<std::string, NpyArray> arrays;
  const zip_int64_t entries = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t st;
    if (zip_stat_index(archive.get(), zip_uint64_t(i), 0, &st) != 0 ||
        !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_CRC))
      throw Error(path + ": unreadable entry " + std::to_string(i) + " in the archive");
    std::string name = st.name;
    const std::string where = path + "[" + name + "]";
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".npy") != 0)
      throw Error(where + ": .npz members must be .npy files");
    // The declared size bounds the allocation; a member cannot claim more
    // than 2^31 bytes here (a tool for attention tensors, not a data lake).
    if (st.size > (zip_uint64_t(1) << 31))
      throw Error(where + ": member of " + std::to_string(st.size) + " bytes is too large");
    std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file(
        zip_fopen_index(archive.get(), zip_uint64_t(i), 0), &zip_fclose);
    if (!file) throw Error(where + ": cannot read: " + zip_strerror(archive.get()));
    std::vector<uint8_t> bytes(size_t(st.size));
    if (zip_fread(file.get(), bytes.data(), st.size) != zip_int64_t(st.size))
      throw Error(where + ": truncated or corrupted member");
    // Checked here, stored and deflated members alike: libzip compares the
    // CRC-32 only when a read reaches the member's end, which one of exactly
    // its size does not, and a flipped bit inside deflated data can still
    // inflate to the declared size.
    const uint32_t crc = crc32_of(bytes);
    if (crc != st.crc)
      throw Error(where + ": bad CRC-32 (the archive says " + std::to_string(st.crc) +
                  ", the member's bytes give " + std::to_string(crc) +
                  "): the archive is corrupted");
    name.resize(name.size() - 4);
    arrays.emplace(name, parse_npy(bytes, where));
  }
  return arrays;
}

std::vector<uint8_t> encode_npy(const NpyArray& array) {
  const std::vector<int64_t>& shape = array.shape;
  std::string dims;
  for (int64_t e : shape) dims += std::to_string(e) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // "(2, 3)"; a 1-tuple keeps "(4,)"
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string header = std::string("{'descr': '") + (array.dtype() == DType::f32 ? "<f4" : "<f8") +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad with spaces so that magic + version + length + header ends on a 64-byte
  // boundary, the header ending in '\n' (as NumPy writes it).
  const bool v2 = header.size() + 1 + 10 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  io::ByteWriter out;
  for (uint8_t byte : kMagic) out.u8(byte);
  out.u8(v2 ? 2 : 1);
  out.u8(0);
  if (v2) {
    out.u32(uint32_t(header.size()));
  } else {
    out.u8(uint8_t(header.size() & 0xff));
    out.u8(uint8_t(header.size() >> 8));
  }
  out.raw(header.data(), header.size());
  if (const auto* f32 = std::get_if<std::vector<float>>(&array.values))
    out.floats(f32->data(), f32->size());
  else
    for (double v : std::get<std::vector<double>>(array.values)) out.f64(v);
  return std::move(out.bytes());
}

void write_npy(const std::string& path, const NpyArray& array, bool overwrite) {
  if (!overwrite && std::filesystem::exists(path))
    throw Error(path + ": already exists; refusing to overwrite it (pass --force)");
  io::write_file_atomically(path, encode_npy(array));
}

}  // namespace mhla::tools
