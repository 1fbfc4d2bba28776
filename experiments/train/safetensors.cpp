#include "train/safetensors.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "mhla/error.hpp"
#include "mhla_support/byte_stream.hpp"

namespace mhla::train {

using nlohmann::json;

std::vector<uint8_t> encode_safetensors(const SafeTensors& file) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    int64_t count = 1;
    for (int64_t d : tensor.shape) count *= d;
    if (count != int64_t(tensor.data.size()))
      throw Error("safetensors: tensor '" + name + "' has " + std::to_string(tensor.data.size()) +
                  " values for shape of " + std::to_string(count));
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + 4 * uint64_t(count)}}};
    offset += 4 * uint64_t(count);
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  // The format pads the header with spaces so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  io::ByteWriter out;
  out.i64(int64_t(text.size()));
  out.raw(text.data(), text.size());
  for (const auto& [name, tensor] : file.tensors)
    out.floats(tensor.data.data(), tensor.data.size());
  return std::move(out.bytes());
}

void check_safetensors_preamble(std::span<const uint8_t> head, uint64_t size,
                                const std::string& source) {
  io::ByteReader in(head, source);
  const uint64_t header_length = uint64_t(in.i64("header length"));
  if (header_length > size - 8 || in.remaining() == 0 || in.u8("header") != '{')
    throw Error(source + ": not a safetensors file (an 8-byte header length, at most the " +
                std::to_string(size) + " bytes of the file, then a JSON object)");
}

SafeTensors decode_safetensors(std::span<const uint8_t> bytes, const std::string& source) {
  io::ByteReader in(bytes, source);
  const int64_t header_length = in.i64("header length");
  in.require(header_length, 1, "header");
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  const json header = json::parse(text, text + header_length, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) throw Error(source + ": the safetensors header is not a JSON object");
  const std::span<const uint8_t> data = bytes.subspan(8 + size_t(header_length));
  auto fail = [&](const std::string& name, const std::string& why) {
    throw Error(source + ": tensor '" + name + "': " + why);
  };

  SafeTensors file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(source + ": __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw Error(source + ": metadata '" + key + "' is not a string");
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(name, "needs dtype, shape and data_offsets");
    if (entry["dtype"] != "F32")
      fail(name, "dtype " + entry["dtype"].dump() + " is not supported (only F32)");
    const json& shape = entry["shape"];
    const json& offsets = entry["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      fail(name, "malformed shape or data_offsets");
    SafeTensor tensor;
    uint64_t count = 1;
    for (const json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
        fail(name, "bad dimension " + d.dump());
      tensor.shape.push_back(d.get<int64_t>());
      count *= d.get<uint64_t>();
      if (count > data.size()) fail(name, "shape " + shape.dump() + " is larger than the file");
    }
    const uint64_t begin = offsets[0], end = offsets[1];
    if (begin > end || end > data.size())
      fail(name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] outside the " + std::to_string(data.size()) +
                     " data bytes (truncated file?)");
    if (end - begin != 4 * count)
      fail(name, "data_offsets span " + std::to_string(end - begin) + " bytes, shape " +
                     shape.dump() + " needs " + std::to_string(4 * count));
    io::ByteReader values(data.subspan(size_t(begin), size_t(end - begin)),
                          source + ": tensor '" + name + "'");
    tensor.data = values.floats(int64_t(count), "values");
    ranges.emplace_back(begin, end);
    file.tensors.emplace(name, std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw Error(source + ": tensors overlap in the data section");
  return file;
}

}  // namespace mhla::train
