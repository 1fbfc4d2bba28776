#pragma once
// Fashion-MNIST (Xiao et al., 2017) from the IDX files of Debian's
// dataset-fashion-mnist package, and its patch batches for a ViT.
#include <string>

#include "train/batch.hpp"

namespace mhla::train {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The last 5,000 images of the 60,000 in the training file are the validation
// split (never trained on); the others are for training.
inline constexpr int64_t kFashionValidationImages = 5000;
inline constexpr int64_t kFashionTrainableImages = 60000 - kFashionValidationImages;

struct ImageSet {
  int64_t count = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // [count, height, width]
  std::vector<uint8_t> labels;  // [count], 0..9
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir`. A missing,
// truncated or inconsistent file is an mhla::Error naming it (and, when missing,
// the package that provides it).
ImageSet load_fashion_mnist(const std::string& dir, bool train);

// Samples order[first .. first + size) of `set` cut into patch x patch patches,
// row-major over the patch grid, pixels scaled to zero mean and unit variance
// (the training set's statistics): patches [size, tokens, patch * patch].
Batch make_image_batch(const ImageSet& set, const std::vector<int64_t>& order, int64_t first,
                       int64_t size, int64_t patch);

}  // namespace mhla::train
