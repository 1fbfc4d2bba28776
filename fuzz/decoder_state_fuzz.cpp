// libFuzzer target: Decoder::deserialize on arbitrary bytes must either build a
// usable decoder or throw mhla::Error; any crash, sanitizer report, leak or
// other exception is a bug. Each input is tried twice: as given, and with its
// trailing CRC-32 recomputed, so mutations reach the field checks behind the
// checksum instead of stopping at it.
#include <zlib.h>

#include <cstdint>
#include <vector>

#include "mhla/decoder.hpp"
#include "mhla/error.hpp"

namespace {

void load_and_step(std::span<const uint8_t> bytes) {
  try {
    mhla::Decoder decoder = mhla::Decoder::deserialize(bytes);
    const mhla::DecoderOptions& o = decoder.options();
    // One step on zeros exercises the loaded state, unless it is too large to
    // be worth it (sizes are bounded by the input length anyway).
    if (o.batch * o.heads * (o.dk + o.dv) > (1 << 16)) return;
    std::vector<float> qk(size_t(o.batch * o.heads * o.dk)), v(size_t(o.batch * o.heads * o.dv)),
        out(v.size());
    decoder.step({qk.data(), {o.batch, 1, o.heads, o.dk}}, {qk.data(), {o.batch, 1, o.heads, o.dk}},
                 {v.data(), {o.batch, 1, o.heads, o.dv}},
                 {out.data(), {o.batch, 1, o.heads, o.dv}});
  } catch (const mhla::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  load_and_step({data, size});
  if (size < 4) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint32_t crc = uint32_t(crc32_z(crc32(0L, Z_NULL, 0), fixed.data(), size - 4));
  for (int i = 0; i < 4; ++i) fixed[size - 4 + size_t(i)] = uint8_t(crc >> (8 * i));
  load_and_step(fixed);
  return 0;
}
