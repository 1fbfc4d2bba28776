#include "train/fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "mhla/error.hpp"
#include "mhla_support/checked_math.hpp"
#include "mhla_support/files.hpp"

namespace mhla::train {
namespace {

// Fashion-MNIST's training-set pixel mean and standard deviation (on [0, 1]).
constexpr float kMean = 0.2860f, kStd = 0.3530f;

// Reads up to `count` decompressed bytes; fewer only at the stream's end.
size_t read_some(gzFile file, uint8_t* out, size_t count, const std::string& path) {
  size_t done = 0;
  while (done < count) {
    const unsigned ask = unsigned(std::min<size_t>(count - done, size_t(1) << 30));
    const int got = gzread(file, out + done, ask);
    if (got < 0) {
      int code = 0;
      throw Error(path + ": not a valid gzip file (" + gzerror(file, &code) + ")");
    }
    if (got == 0) break;
    done += size_t(got);
  }
  return done;
}

uint32_t big_endian(const uint8_t* b) {
  return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | uint32_t(b[3]);
}

// A gzipped IDX file of unsigned bytes with `rank` dimensions: its dimensions
// into `dims`, and its data. The header is read and checked first; then
// exactly the bytes it announces, so a wrong or endless input stops early.
std::vector<uint8_t> read_idx(const std::string& path, int rank, std::vector<int64_t>& dims) {
  if (!std::filesystem::exists(path))
    throw Error(
        path +
        ": not found (apt-get install dataset-fashion-mnist, or pass the folder with --data)");
  io::require_regular_file(path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw Error(path + ": cannot open");
  std::vector<uint8_t> header(4 + 4 * size_t(rank));
  if (read_some(file.get(), header.data(), header.size(), path) != header.size())
    throw Error(path + ": truncated IDX header");
  const uint32_t magic = big_endian(header.data());
  if (magic != (0x0800u | uint32_t(rank)))
    throw Error(path + ": not an IDX file of " + std::to_string(rank) +
                "-D unsigned bytes (magic " + std::to_string(magic) + ")");
  dims.clear();
  for (int i = 0; i < rank; ++i) dims.push_back(big_endian(header.data() + 4 + 4 * size_t(i)));
  const int64_t total = detail::checked_product(dims, path + ": IDX dimensions");
  // A data set for a 2-core trainer, not a data lake: beyond 2^31 bytes is a wrong file.
  if (total > (int64_t(1) << 31))
    throw Error(path + ": IDX header announces " + std::to_string(total) + " bytes; too large");
  std::vector<uint8_t> data(static_cast<size_t>(total));
  const size_t got = read_some(file.get(), data.data(), data.size(), path);
  uint8_t extra = 0;
  if (got != data.size() || read_some(file.get(), &extra, 1, path) != 0)
    throw Error(path + ": " +
                (got != data.size() ? std::to_string(got) : "more than " + std::to_string(got)) +
                " data bytes, the header promises " + std::to_string(total));
  return data;
}

}  // namespace

ImageSet load_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz",
                    labels_path = prefix + "-labels-idx1-ubyte.gz";
  std::vector<int64_t> image_dims, label_dims;
  std::vector<uint8_t> images = read_idx(images_path, 3, image_dims);
  std::vector<uint8_t> labels = read_idx(labels_path, 1, label_dims);
  if (image_dims[0] != label_dims[0])
    throw Error(images_path + " holds " + std::to_string(image_dims[0]) + " images but " +
                labels_path + " " + std::to_string(label_dims[0]) + " labels");
  ImageSet set;
  set.count = image_dims[0];
  set.height = image_dims[1];
  set.width = image_dims[2];
  set.pixels = std::move(images);
  set.labels = std::move(labels);
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
