#include "presets.hpp"

#include <algorithm>

#include "mhla/error.hpp"
#include "train/fashion_mnist.hpp"

namespace mhla::tools {

using train::AttentionKind;
using train::RunConfig;
using train::TaskKind;

namespace {

// The 55,000 training images in batches of 64: 859 steps an epoch.
constexpr int64_t kPlateauBatch = 64,
                  kPlateauEpoch = train::kFashionTrainableImages / kPlateauBatch;

// Fashion-MNIST at 196 tokens (2 x 2-pixel patches, 14 x 14 tokens), M = 16
// blocks of 4 x 4 tokens (the last row and column of blocks hold 2), on every
// training image, evaluated each epoch on all 5,000 validation images and
// stopped after 2 epochs without a better validation accuracy (at most 8).
RunConfig plateau_config() {
  RunConfig c;
  c.task = TaskKind::fashion_mnist;
  c.attention.assign(2, AttentionKind::mhla);
  c.dim = 64;
  c.heads = 2;
  c.mlp_hidden = 128;
  c.conv_kernel = 0;
  c.design.mixing_lr_scale = 10;
  c.design.mixing_init = MixingTransform::linear;
  c.patch = 2;
  c.tile = 4;
  c.batch = kPlateauBatch;
  c.steps = 8 * kPlateauEpoch;
  c.warmup = kPlateauEpoch / 2;
  c.lr = 2e-3;
  c.eval_every = kPlateauEpoch;
  c.patience = 2;
  return c;
}

}  // namespace

RunConfig preset_config(TaskKind task, const std::string& preset) {
  if (preset == "plateau") {
    if (task != TaskKind::fashion_mnist)
      throw Error("the plateau preset is for fashion-mnist only");
    return plateau_config();
  }
  if (preset != "quick" && preset != "full")
    throw Error("unknown preset '" + preset + "'; expected quick, full or plateau");
  const bool quick = preset == "quick";
  RunConfig c;
  c.task = task;
  c.attention.assign(2, AttentionKind::mhla);
  c.dim = 64;
  c.heads = 2;
  c.mlp_hidden = 128;
  // MHLA's mixing learns too slowly at the shared rate (see experiments/training.md).
  c.design.mixing_lr_scale = 10;
  if (task == TaskKind::mqar) {
    c.conv_kernel = 4;
    c.vocab = 256;
    c.seq_len = 256;
    c.kv_pairs = 8;
    c.block = 0;  // M = 16 at N = 256, the authors' setting
    c.batch = 32;
    c.steps = quick ? 200 : 800;
    c.warmup = c.steps / 10;
    c.lr = 1e-2;
    c.eval_samples = quick ? 128 : 512;
    c.design.mixing_init =
        MixingTransform::uniform;  // causal: 1/(i+1), the authors' language-model init
  } else if (task == TaskKind::text) {
    c.conv_kernel = 4;
    c.vocab = 256;
    c.seq_len = 512;
    c.block = 64;  // 64-token chunks: M = 8
    c.batch = 16;
    c.steps = quick ? 100 : 500;
    c.warmup = c.steps / 10;
    c.lr = 3e-3;
    c.eval_samples = quick ? 16 : 128;
    c.design.mixing_init = MixingTransform::uniform;
  } else {
    c.conv_kernel = 0;
    c.patch = 1;  // 28 x 28 = 784 tokens
    c.tile = 7;   // 4 x 4 = 16 blocks
    c.batch = 32;
    c.train_images = quick ? 1600 : 6400;
    c.eval_images = quick ? 300 : 1000;
    c.steps = quick ? 80 : 400;  // full: 2 epochs of 6400 images
    c.warmup = c.steps / 10;
    c.lr = 2e-3;
    c.design.mixing_init = MixingTransform::linear;  // the paper's locality init
  }
  c.eval_every = std::max<int64_t>(1, c.steps / 8);
  return c;
}

std::vector<ComparisonEntry> comparison_entries(const std::string& tasks,
                                                const std::string& preset) {
  const bool quick = preset == "quick", all = tasks == "all";
  std::vector<ComparisonEntry> entries;
  if (preset == "plateau") {
    if (!all && tasks != "fashion-mnist")
      throw Error("the plateau preset is for fashion-mnist only (got --tasks " + tasks + ")");
    // A grid of 4 rates a factor 2 apart, chosen by 2-epoch runs of the first seed.
    RunConfig c = plateau_config();
    const std::vector<double> grid = {5e-4, 1e-3, 2e-3, 4e-3};
    const int64_t sweep = 2 * kPlateauEpoch;
    // The one-token baseline: each image is one 28 x 28 patch, so attention has
    // nothing to mix and the model is an MLP on the pixels.
    RunConfig one = c;
    one.patch = 28;
    one.tile = 1;
    entries.push_back({"fashion-mnist 1 token", one, {"softmax"}, grid, sweep, true});
    entries.push_back({"fashion-mnist 196 tokens", c, {"softmax", "linear", "mhla"}, grid, sweep});
    c.design.value_conv = 3;
    entries.push_back(
        {"fashion-mnist 196 tokens + conv(v)", c, {"softmax", "linear", "mhla"}, grid, sweep});
    return entries;
  }
  auto rates = [&](double lr) {
    return quick ? std::vector<double>{lr} : std::vector<double>{lr / 2, lr};
  };
  if (all || tasks == "text") {
    const RunConfig c = preset_config(TaskKind::text, preset);
    entries.push_back(
        {"text KJV N=512", c, {"softmax", "linear", "mhla", "mhla/softmax"}, rates(c.lr)});
  }
  if (all || tasks == "fashion-mnist") {
    RunConfig c = preset_config(TaskKind::fashion_mnist, preset);
    entries.push_back({"fashion-mnist 784 tokens", c, {"linear", "mhla"}, rates(c.lr)});
    c.design.value_conv = 3;
    if (!quick)
      entries.push_back({"fashion-mnist 784 tokens + conv(v)", c, {"linear", "mhla"}, rates(c.lr)});
  }
  if (all || tasks == "mqar") {
    const RunConfig c = preset_config(TaskKind::mqar, preset);
    entries.push_back({"mqar N=256 kv=8", c, {"linear", "mhla"}, rates(c.lr)});
  }
  if (entries.empty())
    throw Error("unknown tasks '" + tasks + "'; expected text, fashion-mnist, mqar or all");
  return entries;
}

}  // namespace mhla::tools
