#pragma once
// The safetensors file format (Hugging Face): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes. Only F32 tensors
// are written or accepted.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace mhla::train {

struct SafeTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafeTensors {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

std::vector<uint8_t> encode_safetensors(const SafeTensors& file);
// Treats the bytes as untrusted: a bad length, JSON, dtype, shape or offset is an
// mhla::Error that starts with `source` and says what is wrong.
SafeTensors decode_safetensors(std::span<const uint8_t> bytes, const std::string& source);
// The first bytes of a file of `size` bytes (at least 9 where there are):
// an mhla::Error unless they open a safetensors file whose header fits in it,
// so a reader can refuse another kind of file before reading it whole.
void check_safetensors_preamble(std::span<const uint8_t> head, uint64_t size,
                                const std::string& source);

}  // namespace mhla::train
