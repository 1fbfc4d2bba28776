#include "train/fashion_mnist.hpp"

#include <zlib.h>

#include <filesystem>
#include <memory>

#include "mhla/error.hpp"

namespace mhla::train {
namespace {

// Fashion-MNIST's training-set pixel mean and standard deviation (on [0, 1]).
constexpr float kMean = 0.2860f, kStd = 0.3530f;

std::vector<uint8_t> read_gzip(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw Error(
        path +
        ": not found (apt-get install dataset-fashion-mnist, or pass the folder with --data)");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw Error(path + ": cannot open");
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  for (;;) {
    const int got = gzread(file.get(), chunk, sizeof chunk);
    if (got < 0) {
      int code = 0;
      throw Error(path + ": not a valid gzip file (" + gzerror(file.get(), &code) + ")");
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 |
         uint32_t(b[at + 3]);
}

// An IDX file of unsigned bytes with `rank` dimensions: returns the dimensions.
std::vector<int64_t> idx_header(const std::vector<uint8_t>& bytes, int rank,
                                const std::string& path) {
  const size_t header = 4 + 4 * size_t(rank);
  if (bytes.size() < header) throw Error(path + ": truncated IDX header");
  const uint32_t magic = big_endian(bytes, 0);
  if (magic != (0x0800u | uint32_t(rank)))
    throw Error(path + ": not an IDX file of " + std::to_string(rank) +
                "-D unsigned bytes (magic " + std::to_string(magic) + ")");
  std::vector<int64_t> dims;
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    dims.push_back(big_endian(bytes, 4 + 4 * size_t(i)));
    total *= dims.back();
  }
  if (bytes.size() != header + size_t(total))
    throw Error(path + ": " + std::to_string(bytes.size() - header) +
                " data bytes, the header promises " + std::to_string(total));
  return dims;
}

}  // namespace

ImageSet load_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz",
                    labels_path = prefix + "-labels-idx1-ubyte.gz";
  const std::vector<uint8_t> images = read_gzip(images_path), labels = read_gzip(labels_path);
  const std::vector<int64_t> image_dims = idx_header(images, 3, images_path);
  const std::vector<int64_t> label_dims = idx_header(labels, 1, labels_path);
  if (image_dims[0] != label_dims[0])
    throw Error(images_path + " holds " + std::to_string(image_dims[0]) + " images but " +
                labels_path + " " + std::to_string(label_dims[0]) + " labels");
  ImageSet set;
  set.count = image_dims[0];
  set.height = image_dims[1];
  set.width = image_dims[2];
  set.pixels.assign(images.begin() + 16, images.end());
  set.labels.assign(labels.begin() + 8, labels.end());
  for (uint8_t label : set.labels)
    if (label > 9) throw Error(labels_path + ": label " + std::to_string(label) + " outside 0..9");
  return set;
}

Batch make_image_batch(const ImageSet& set, const std::vector<int64_t>& order, int64_t first,
                       int64_t size, int64_t patch) {
  if (set.height % patch != 0 || set.width % patch != 0)
    throw Error("patch size " + std::to_string(patch) + " does not divide the " +
                std::to_string(set.height) + " x " + std::to_string(set.width) + " images");
  const int64_t gh = set.height / patch, gw = set.width / patch, patch_dim = patch * patch;
  Batch batch;
  batch.size = size;
  batch.patches.resize(size_t(size * gh * gw * patch_dim));
  batch.targets.resize(size_t(size));
  for (int64_t s = 0; s < size; ++s) {
    const int64_t image = order[size_t(first + s)];
    const uint8_t* pixels = set.pixels.data() + image * set.height * set.width;
    batch.targets[size_t(s)] = set.labels[size_t(image)];
    float* out = batch.patches.data() + s * gh * gw * patch_dim;
    for (int64_t ph = 0; ph < gh; ++ph)
      for (int64_t pw = 0; pw < gw; ++pw)
        for (int64_t y = 0; y < patch; ++y)
          for (int64_t x = 0; x < patch; ++x)
            *out++ =
                (float(pixels[(ph * patch + y) * set.width + pw * patch + x]) / 255.0f - kMean) /
                kStd;
  }
  return batch;
}

}  // namespace mhla::train
