// The .npy reader and writer: round trips, every header form NumPy writes, and
// a named error for every malformed or unsupported input.
#include <cstring>
#include <filesystem>

#include "common/npy.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;
using tools::DType;

// A hand-built .npy: magic, version, header (padded to 64 bytes with '\n'), data.
std::vector<uint8_t> npy_bytes(int major, const std::string& dict,
                               const std::vector<uint8_t>& data) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  const size_t n = header.size();
  std::string b = "\x93NUMPY";
  b += char(major);
  b += '\0';
  b += char(n & 0xff);
  b += char(n >> 8);
  if (major != 1) b += std::string(2, '\0');
  b += header;
  b.append(data.begin(), data.end());
  return {b.begin(), b.end()};
}

std::vector<uint8_t> f32_data(std::vector<float> values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    tools::parse_npy(bytes, "x.npy");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string error_of_as_double(const tools::NpyArray& a) {
  try {
    a.as<double>();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Npy, RoundTripsShapesAndDtypes) {
  for (DType dtype : {DType::f32, DType::f64})
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {0}, {4}, {2, 3, 4}}) {
      std::vector<double> values(size_t(numel(shape)));
      for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25 * double(i) - 1.5;
      const std::vector<uint8_t> bytes =
          tools::encode_npy(tools::NpyArray::of(dtype, shape, values));
      EXPECT_EQ(bytes.size() % 64, (values.size() * (dtype == DType::f32 ? 4 : 8)) % 64);
      const tools::NpyArray a = tools::parse_npy(bytes, "x.npy");
      EXPECT_EQ(a.dtype(), dtype);
      EXPECT_EQ(a.shape, shape);
      EXPECT_EQ(a.widened(), values);
    }
}

// float32 data stays float32 from file to caller: read as float, never widened.
TEST(Npy, KeepsTheFilesOwnDtype) {
  const std::vector<float> values = {0.1f, -3.3f, 1e-30f};
  const tools::NpyArray a =
      tools::parse_npy(tools::encode_npy(tools::NpyArray{{3}, values}), "x.npy");
  EXPECT_EQ(a.dtype(), DType::f32);
  EXPECT_EQ(a.as<float>(), values);
  EXPECT_THAT(error_of_as_double(a), HasSubstr("a float32 array read as float64"));
}

TEST(Npy, ReadsEveryHeaderFormNumpyWrites) {
  const auto data = f32_data({1, 2, 3, 4, 5, 6});
  for (int major : {1, 2, 3})
    for (const char* dict : {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                             "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,3)}",
                             "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"}) {
      const tools::NpyArray a = tools::parse_npy(npy_bytes(major, dict, data), "x.npy");
      EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3})) << dict;
      EXPECT_EQ(a.as<float>()[5], 6.0f);
    }
}

TEST(Npy, MalformedOrUnsupportedInputsAreNamedErrors) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const auto two = f32_data({1, 2});
  EXPECT_EQ(error_of(npy_bytes(1, ok, two)), "no error");
  std::vector<uint8_t> bad_magic = npy_bytes(1, ok, two);
  bad_magic[1] = 'X';
  EXPECT_THAT(error_of(bad_magic), HasSubstr("x.npy: not a .npy file"));
  EXPECT_THAT(error_of(npy_bytes(4, ok, two)),
              HasSubstr(".npy format version 4.0 is not supported"));
  const auto full = npy_bytes(1, ok, two);
  EXPECT_THAT(error_of({full.begin(), full.begin() + 30}), HasSubstr("truncated"));
  EXPECT_THAT(error_of({full.begin(), full.end() - 1}),
              HasSubstr("data holds 7 bytes but shape [2] of float32 needs 8"));
  std::vector<uint8_t> extra = full;
  extra.push_back(0);
  EXPECT_THAT(error_of(extra), HasSubstr("truncated or extra data"));
  EXPECT_THAT(
      error_of(npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", two)),
      HasSubstr("big-endian data ('>f4') is not supported"));
  EXPECT_THAT(
      error_of(npy_bytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", two)),
      HasSubstr("unsupported dtype '<i4' (need float32 '<f4' or float64 '<f8')"));
  EXPECT_THAT(
      error_of(npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", two)),
      HasSubstr("Fortran-order data is not supported"));
  EXPECT_THAT(error_of(npy_bytes(1, "{'descr': '<f4', 'shape': (2,), }", two)),
              HasSubstr("lacks one of 'descr', 'fortran_order', 'shape'"));
  EXPECT_THAT(error_of(npy_bytes(
                  1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", two)),
              HasSubstr("unexpected header key 'x'"));
  EXPECT_THAT(error_of(npy_bytes(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", two)),
              HasSubstr("malformed .npy header"));
  EXPECT_THAT(
      error_of(npy_bytes(
          1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", two)),
      HasSubstr("overflows"));
  EXPECT_THAT(
      error_of(npy_bytes(
          1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", two)),
      HasSubstr("overflows"));
}

TEST(Npy, WriteRefusesToOverwriteUnlessAsked) {
  const auto dir = std::filesystem::temp_directory_path() / "mhla-npy-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.npy").string();
  std::filesystem::remove(path);
  tools::write_npy(path, tools::NpyArray::of(DType::f64, {2}, std::vector<double>{1, 2}), false);
  try {
    tools::write_npy(path, tools::NpyArray::of(DType::f64, {2}, std::vector<double>{3, 4}), false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                HasSubstr("already exists; refusing to overwrite it (pass --force)"));
  }
  EXPECT_EQ(tools::read_npy(path).as<double>(), (std::vector<double>{1, 2}));
  tools::write_npy(path, tools::NpyArray::of(DType::f64, {2}, std::vector<double>{3, 4}), true);
  EXPECT_EQ(tools::read_npy(path).as<double>(), (std::vector<double>{3, 4}));
  EXPECT_THROW(tools::read_npy((dir / "missing.npy").string()), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mhla::test
