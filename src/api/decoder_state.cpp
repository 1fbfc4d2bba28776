// The decoder's snapshot format, version 1 (docs/decoder-state.md). All
// integers and floats little-endian; the file ends with a CRC-32 (zlib's) of
// every byte before it. The mixed prefixes are not stored: they are a function
// of the finished blocks and w, and are rebuilt on load.
#include <zlib.h>

#include <cmath>

#include "cpu/simd/decode_token.hpp"
#include "mhla/decoder.hpp"
#include "mhla_support/byte_stream.hpp"
#include "mhla_support/checked_math.hpp"
#include "mhla_support/files.hpp"

namespace mhla {
namespace {

constexpr char kMagic[8] = {'M', 'H', 'L', 'A', 'D', 'E', 'C', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = sizeof kMagic + 4;  // magic + version
constexpr size_t kChecksum = 4;

uint32_t crc32_of(std::span<const uint8_t> bytes) {
  return uint32_t(crc32_z(crc32(0L, Z_NULL, 0), bytes.data(), bytes.size()));
}

void check_magic(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() < sizeof kMagic || !std::equal(kMagic, kMagic + sizeof kMagic, bytes.begin()))
    throw Error(source + ": not an mhla decoder state (no MHLADEC header)");
}

// A stored enum byte, checked against its range.
template <typename Enum>
Enum read_enum(io::ByteReader& in, const char* field, Enum last) {
  const uint8_t value = in.u8(field);
  if (value > uint8_t(last))
    in.fail(std::string("invalid '") + field + "' value " + std::to_string(value));
  return Enum(value);
}

bool read_bool(io::ByteReader& in, const char* field) {
  const uint8_t value = in.u8(field);
  if (value > 1) in.fail(std::string("invalid '") + field + "' flag " + std::to_string(value));
  return value == 1;
}

std::vector<float> read_finite(io::ByteReader& in, int64_t count, const char* field) {
  std::vector<float> values = in.floats(count, field);
  for (float v : values)
    if (!std::isfinite(v)) in.fail(std::string("non-finite value in '") + field + "'");
  return values;
}

// Product of sizes read from the input, each positive, without overflow.
int64_t checked_count(io::ByteReader& in, const std::vector<int64_t>& sizes, const char* field) {
  for (int64_t e : sizes)
    if (e <= 0) in.fail(std::string("invalid ") + field + " sizes " + shape_to_string(sizes));
  try {
    return detail::checked_product(sizes, field);
  } catch (const Error& e) {
    in.fail(e.what());
  }
}

// The caller's expectation against the snapshot, naming the first difference.
void check_expected(const std::string& source, const DecoderOptions& got,
                    const DecoderOptions& want) {
  const auto mismatch = [&](const char* field, const std::string& g, const std::string& w) {
    throw Error(source + ": holds a decoder with " + field + " = " + g + " but " + field + " = " +
                w + " was expected");
  };
  const std::pair<const char*, std::pair<int64_t, int64_t>> sizes[] = {
      {"batch", {got.batch, want.batch}},
      {"heads", {got.heads, want.heads}},
      {"dk", {got.dk, want.dk}},
      {"dv", {got.dv, want.dv}},
      {"block", {got.block, want.block}}};
  for (const auto& [field, values] : sizes)
    if (values.first != values.second)
      mismatch(field, std::to_string(values.first), std::to_string(values.second));
  if (got.feature_map != want.feature_map)
    mismatch("feature_map", to_string(got.feature_map), to_string(want.feature_map));
  if (got.normalize != want.normalize)
    mismatch("normalize", got.normalize ? "true" : "false", want.normalize ? "true" : "false");
  if (got.mixing != want.mixing) mismatch("mixing", to_string(got.mixing), to_string(want.mixing));
}

}  // namespace

std::vector<uint8_t> Decoder::serialize() const {
  io::ByteWriter out;
  out.raw(kMagic, sizeof kMagic);
  out.u32(kVersion);
  for (int64_t size : {options_.batch, options_.heads, options_.dk, options_.dv, options_.block})
    out.i64(size);
  out.u8(uint8_t(options_.feature_map));
  out.u8(options_.normalize ? 1 : 0);
  out.u8(uint8_t(options_.mixing));
  out.u8(options_.recompute_mix_every_token ? 1 : 0);
  out.f64(options_.eps);
  out.u8(options_.scale ? 1 : 0);
  out.f64(options_.scale.value_or(0.0));
  const int64_t width = mixing_.toeplitz ? mixing_.length + 1 : mixing_.blocks;
  out.u8(mixing_.per_head ? 1 : 0);
  out.i64(width);  // L + 1 (Toeplitz) or M (dense)
  out.floats(w_.data(), w_.size());
  for (int64_t position : positions_) out.i64(position);
  // Summaries are stored as the operator's [Dk, Dv + 1], whatever layout the
  // step kernel keeps them in.
  const cpu::simd::StateLayout layout(options_.dk, options_.dv);
  std::vector<float> summary(size_t(options_.dk * (options_.dv + 1)));
  const auto write = [&](const float* stored) {
    layout.load(stored, summary.data());
    out.floats(summary.data(), summary.size());
  };
  for (const HeadState& s : states_) {
    for (int64_t b = 0; b < kept_count(s); ++b) write(kept_summary(s, b));
    if (mixing_.toeplitz) write(s.far.data());
    write(s.running.data());
  }
  out.u32(crc32_of(out.bytes()));
  return std::move(out.bytes());
}

void Decoder::save(const std::string& path) const { io::write_file_atomically(path, serialize()); }

Decoder Decoder::load(const std::string& path, const std::optional<DecoderOptions>& expect) {
  const std::string source = "decoder state '" + path + "'";
  const io::InputFile file(path);
  // The magic first: another kind of file is refused before it is read whole.
  check_magic(file.head(sizeof kMagic), source);
  return deserialize(file.read_all(), expect, source);
}

Decoder Decoder::deserialize(std::span<const uint8_t> bytes,
                             const std::optional<DecoderOptions>& expect,
                             const std::string& source) {
  io::ByteReader in(bytes, source);
  check_magic(bytes, source);
  if (bytes.size() < kHeader + kChecksum)
    throw Error(source + ": truncated: " + std::to_string(bytes.size()) + " bytes");
  in.skip(sizeof kMagic, "magic");
  const uint32_t version = in.u32("version");
  if (version != kVersion)
    in.fail("format version " + std::to_string(version) + " is not supported (this build reads " +
            "version " + std::to_string(kVersion) + ")");
  const std::span<const uint8_t> body = bytes.first(bytes.size() - kChecksum);
  const std::span<const uint8_t> stored = bytes.last(kChecksum);
  const uint32_t expected_crc = uint32_t(stored[0]) | uint32_t(stored[1]) << 8 |
                                uint32_t(stored[2]) << 16 | uint32_t(stored[3]) << 24;
  if (crc32_of(body) != expected_crc)
    throw Error(source + ": checksum mismatch: the file is corrupted or truncated");
  in = io::ByteReader(body, source);
  in.skip(kHeader, "header");

  DecoderOptions options;
  for (int64_t* size : {&options.batch, &options.heads, &options.dk, &options.dv, &options.block})
    *size = in.i64("sizes");
  options.feature_map = read_enum(in, "feature_map", FeatureMap::elu1);
  options.normalize = read_bool(in, "normalize");
  options.mixing = read_enum(in, "mixing", MixingForm::toeplitz);
  options.recompute_mix_every_token = read_bool(in, "recompute_mix_every_token");
  options.eps = in.f64("eps");
  const bool has_scale = read_bool(in, "has_scale");
  const double scale = in.f64("scale");
  if (has_scale) options.scale = scale;
  if (expect) check_expected(source, options, *expect);

  const bool per_head = read_bool(in, "per_head");
  const int64_t width = in.i64("w width");
  const bool toeplitz = options.mixing == MixingForm::toeplitz;
  std::vector<int64_t> w_shape =
      toeplitz ? std::vector<int64_t>{width} : std::vector<int64_t>{width, width};
  if (per_head) w_shape.insert(w_shape.begin(), options.heads);
  // Sizes come from the input: before anything is allocated, bound them by
  // the bytes present (w, one position per sequence, at least one running
  // block per sequence and head), with overflow-checked products.
  const int64_t w_count = checked_count(in, w_shape, "w");
  // The first product bounds dv far below INT64_MAX, so dv + 1 cannot overflow.
  checked_count(in, {options.batch, options.heads, options.dk, options.dv}, "states");
  const int64_t state_floats =
      checked_count(in, {options.batch, options.heads, options.dk, options.dv + 1}, "states");
  in.require(w_count, 4, "w");
  in.require(options.batch, 8, "positions");
  in.require(state_floats, 4, "states");
  const std::vector<float> w = read_finite(in, w_count, "w");

  Decoder decoder = [&] {
    try {
      return Decoder(options, {w.data(), w_shape});
    } catch (const Error& e) {
      in.fail(std::string("inconsistent decoder: ") + e.what());
    }
  }();
  const int64_t x = options.dk * (options.dv + 1);
  const cpu::simd::StateLayout layout(options.dk, options.dv);
  const auto read_summaries = [&](int64_t count, const char* field, Floats& stored) {
    const std::vector<float> summaries = read_finite(in, count * x, field);
    stored.resize(size_t(count * decoder.summary_floats_));
    for (int64_t b = 0; b < count; ++b)
      layout.store(summaries.data() + b * x, stored.data() + b * decoder.summary_floats_);
  };
  for (int64_t b = 0; b < options.batch; ++b) {
    const int64_t position = in.i64("position");
    if (position < 0 || position > decoder.max_tokens())
      in.fail("sequence " + std::to_string(b) + " position " + std::to_string(position) +
              " is outside [0, " + std::to_string(decoder.max_tokens()) + "]");
    decoder.positions_[b] = position;
  }
  for (int64_t task = 0; task < options.batch * options.heads; ++task) {
    const int64_t position = decoder.positions_[task / options.heads];
    HeadState& s = decoder.states_[task];
    const int64_t kept = decoder.kept_blocks(position);
    in.require(kept, 4 * x, "finished blocks");
    read_summaries(kept, "finished blocks", s.finished);
    if (toeplitz) read_summaries(1, "far blocks sum", s.far);
    read_summaries(1, "running block", s.running);
    const int64_t block = position > 0 ? (position - 1) / options.block : 0;
    decoder.mix_prefix(s, task % options.heads, block);
  }
  if (in.remaining() != 0)
    in.fail(std::to_string(in.remaining()) + " unexpected bytes after the last state");
  return decoder;
}

}  // namespace mhla
