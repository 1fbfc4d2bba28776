// Decoder snapshots: a saved and reloaded decoder continues exactly where the
// original would; every damaged or mismatched input is an mhla::Error.
#include <zlib.h>

#include <cstdio>
#include <filesystem>

#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;

struct Tokens {
  int64_t batch, heads, dk, dv;
  std::vector<float> q, k, v;
};

Tokens make_tokens(int64_t batch, int64_t heads, int64_t dk, int64_t dv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t n = batch * heads;
  return {batch,
          heads,
          dk,
          dv,
          cast<float>(uniform(n * dk, -1, 1, rng)),
          cast<float>(uniform(n * dk, -1, 1, rng)),
          cast<float>(uniform(n * dv, -1, 1, rng))};
}

std::vector<float> step(Decoder& dec, const Tokens& t) {
  std::vector<float> o(t.v.size());
  const std::vector<int64_t> qs = {t.batch, 1, t.heads, t.dk}, vs = {t.batch, 1, t.heads, t.dv};
  dec.step(view(t.q, qs), view(t.k, qs), view(t.v, vs), view(o, vs));
  return o;
}

// A batch of two sequences at different positions (one prefilled mid-block).
struct Fixture {
  DecoderOptions options;
  std::vector<float> w;
  std::vector<int64_t> w_shape;
};

Fixture fixture(MixingForm mixing, bool normalize) {
  Fixture f;
  f.options.batch = 2;
  f.options.heads = 2;
  f.options.dk = 3;
  f.options.dv = 2;
  f.options.block = 3;
  f.options.mixing = mixing;
  f.options.normalize = normalize;
  std::mt19937_64 rng(4);
  f.w_shape =
      mixing == MixingForm::toeplitz ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{2, 12, 12};
  f.w = cast<float>(uniform(numel(f.w_shape), 0.05, 1.0, rng));
  return f;
}

Decoder advanced(const Fixture& f) {
  Decoder dec(f.options, view(f.w, f.w_shape));
  for (int64_t t = 0; t < 7; ++t) step(dec, make_tokens(2, 2, 3, 2, 10 + t));
  dec.reset(1);
  std::vector<float> q(5 * 2 * 3, 0.3f), v(5 * 2 * 2, -0.2f), o(v.size());
  dec.prefill(1, view(q, {1, 5, 2, 3}), view(q, {1, 5, 2, 3}), view(v, {1, 5, 2, 2}),
              view(o, {1, 5, 2, 2}));
  return dec;
}

// Rewrites the trailing CRC-32 after a deliberate edit.
std::vector<uint8_t> with_checksum(std::vector<uint8_t> bytes) {
  const uint32_t crc = uint32_t(crc32(0L, bytes.data(), uInt(bytes.size() - 4)));
  for (int i = 0; i < 4; ++i) bytes[bytes.size() - 4 + i] = uint8_t(crc >> (8 * i));
  return bytes;
}

std::string error_of(const std::vector<uint8_t>& bytes,
                     const std::optional<DecoderOptions>& expect = std::nullopt) {
  try {
    Decoder::deserialize(bytes, expect);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(DecoderState, ReloadedDecoderContinuesIdentically) {
  for (MixingForm mixing : {MixingForm::dense, MixingForm::toeplitz})
    for (bool normalize : {true, false}) {
      SCOPED_TRACE(std::string(to_string(mixing)) + (normalize ? " normalized" : " unnormalized"));
      const Fixture f = fixture(mixing, normalize);
      Decoder original = advanced(f);
      Decoder reloaded = Decoder::deserialize(original.serialize(), f.options);
      EXPECT_EQ(reloaded.position(0), 7);
      EXPECT_EQ(reloaded.position(1), 5);
      EXPECT_EQ(reloaded.state_bytes(), original.state_bytes());
      for (int64_t t = 0; t < 12; ++t) {
        const Tokens next = make_tokens(2, 2, 3, 2, 100 + t);
        EXPECT_EQ(step(reloaded, next), step(original, next)) << "step " << t;
      }
    }
}

// A Toeplitz window of L - 1 = 3 kept blocks that has wrapped around its ring
// several times: the snapshot holds them oldest first, and the reloaded
// decoder continues identically and writes the same bytes.
TEST(DecoderState, WrappedToeplitzWindowReloads) {
  DecoderOptions d;
  d.heads = 2;
  d.dk = 3;
  d.dv = 2;
  d.block = 2;
  d.mixing = MixingForm::toeplitz;
  const std::vector<float> w = {1.0f, 0.7f, 0.5f, 0.3f, 0.1f};  // L = 4
  for (int64_t tokens : {13, 15, 17}) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens");
    Decoder original(d, view(w, {5}));
    for (int64_t t = 0; t < tokens; ++t) step(original, make_tokens(1, 2, 3, 2, 50 + t));
    const std::vector<uint8_t> bytes = original.serialize();
    Decoder reloaded = Decoder::deserialize(bytes, d);
    EXPECT_EQ(reloaded.serialize(), bytes);
    for (int64_t t = 0; t < 9; ++t) {
      const Tokens next = make_tokens(1, 2, 3, 2, 200 + t);
      EXPECT_EQ(step(reloaded, next), step(original, next)) << "step " << t;
    }
  }
}

TEST(DecoderState, SaveAndLoadThroughAFile) {
  const Fixture f = fixture(MixingForm::toeplitz, true);
  Decoder original = advanced(f);
  const auto dir = std::filesystem::temp_directory_path() / "mhla-decoder-state-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "state.mhlad").string();
  original.save(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  Decoder loaded = Decoder::load(path);
  const Tokens next = make_tokens(2, 2, 3, 2, 5);
  EXPECT_EQ(step(loaded, next), step(original, next));
  std::filesystem::remove_all(dir);
  try {
    Decoder::load(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("cannot open '" + path + "': No such file"));
  }
  EXPECT_THROW(original.save((dir / "missing-dir" / "state.mhlad").string()), Error);
}

TEST(DecoderState, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = advanced(fixture(MixingForm::dense, true)).serialize();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string error = error_of({bytes.begin(), bytes.begin() + n});
    EXPECT_NE(error, "no error") << "prefix of " << n << " bytes";
  }
}

TEST(DecoderState, EveryFlippedByteIsAnError) {
  const std::vector<uint8_t> bytes = advanced(fixture(MixingForm::toeplitz, false)).serialize();
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> damaged = bytes;
    damaged[i] ^= 0x5a;
    EXPECT_NE(error_of(damaged), "no error") << "byte " << i;
  }
  std::vector<uint8_t> damaged = bytes;
  damaged[40] ^= 1;
  EXPECT_THAT(error_of(damaged), HasSubstr("checksum mismatch"));
}

TEST(DecoderState, HeaderVersionAndExpectations) {
  const Fixture f = fixture(MixingForm::dense, true);
  const std::vector<uint8_t> bytes = advanced(f).serialize();
  std::vector<uint8_t> other = bytes;
  other[0] = 'X';
  EXPECT_THAT(error_of(other), HasSubstr("not an mhla decoder state"));
  other = bytes;
  other[8] = 2;  // version field, CRC left as is: the version is reported first
  EXPECT_THAT(error_of(other),
              HasSubstr("format version 2 is not supported (this build reads version 1)"));
  DecoderOptions expect = f.options;
  expect.heads = 3;
  EXPECT_THAT(error_of(bytes, expect),
              HasSubstr("holds a decoder with heads = 2 but heads = 3 was expected"));
  expect = f.options;
  expect.mixing = MixingForm::toeplitz;
  EXPECT_THAT(error_of(bytes, expect), HasSubstr("mixing = dense but mixing = toeplitz"));
  std::vector<uint8_t> trailing = bytes;
  trailing.insert(trailing.end() - 4, {0, 0, 0, 0});
  EXPECT_THAT(error_of(with_checksum(trailing)),
              HasSubstr("4 unexpected bytes after the last state"));
}

// Inputs whose checksum is right but whose content is not: sizes that would
// allocate far more than the file holds, out-of-range fields.
TEST(DecoderState, InconsistentContentIsAnError) {
  const std::vector<uint8_t> bytes = advanced(fixture(MixingForm::dense, true)).serialize();
  auto patched = [&](size_t offset, int64_t value) {
    std::vector<uint8_t> b = bytes;
    for (int i = 0; i < 8; ++i) b[offset + size_t(i)] = uint8_t(uint64_t(value) >> (8 * i));
    return with_checksum(b);
  };
  // Offsets: magic 8, version 4, then batch, heads, dk, dv, block (8 each).
  EXPECT_THAT(error_of(patched(12, int64_t(1) << 40)), HasSubstr("truncated or inconsistent"));
  EXPECT_THAT(error_of(patched(20, int64_t(1) << 62)), HasSubstr("overflows"));
  // dv = INT64_MAX: dv + 1 must not be formed before dv is bounded (found by fuzzing).
  EXPECT_THAT(error_of(patched(36, INT64_MAX)), HasSubstr("overflows"));
  EXPECT_THAT(error_of(patched(12, 0)), HasSubstr("invalid states sizes"));
  EXPECT_THAT(error_of(patched(44, 0)),
              HasSubstr("inconsistent decoder: mhla::Decoder: options.block"));
  std::vector<uint8_t> b = bytes;
  b[52] = 7;  // feature map
  EXPECT_THAT(error_of(with_checksum(b)), HasSubstr("invalid 'feature_map' value 7"));
}

}  // namespace
}  // namespace mhla::test
