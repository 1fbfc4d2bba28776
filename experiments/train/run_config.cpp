#include "train/run_config.hpp"

#include <cmath>

#include "mhla/error.hpp"
#include "mhla_support/parse_enum.hpp"

namespace mhla::train {

using nlohmann::json;

const char* to_string(TaskKind task) {
  switch (task) {
    case TaskKind::mqar:
      return "mqar";
    case TaskKind::fashion_mnist:
      return "fashion-mnist";
    case TaskKind::text:
      return "text";
  }
  return "?";
}

TaskKind parse_task(const std::string& name) {
  return detail::parse_enum(name, "task",
                            {TaskKind::mqar, TaskKind::fashion_mnist, TaskKind::text});
}

bool is_sequence_task(TaskKind task) { return task != TaskKind::fashion_mnist; }

bool scored_by_loss(TaskKind task) { return task == TaskKind::text; }

std::vector<AttentionKind> parse_attention_list(const std::string& text) {
  std::vector<AttentionKind> kinds;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    kinds.push_back(parse_attention_kind(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return kinds;
}

std::string attention_list_name(const std::vector<AttentionKind>& kinds) {
  std::string name;
  for (AttentionKind k : kinds) name.append(name.empty() ? "" : ",").append(to_string(k));
  return name;
}

json to_json(const RunConfig& c) {
  return {{"task", to_string(c.task)},
          {"attention", attention_list_name(c.attention)},
          {"dim", c.dim},
          {"heads", c.heads},
          {"mlp_hidden", c.mlp_hidden},
          {"conv_kernel", c.conv_kernel},
          {"mixing_init", to_string(c.design.mixing_init)},
          {"mixing_param", to_string(c.design.mixing_param)},
          {"mixing_shared", c.design.mixing_shared},
          {"mixing_lr_scale", c.design.mixing_lr_scale},
          {"feature_map", to_string(c.design.feature_map)},
          {"gated_head", c.design.gated_head},
          {"rope", c.design.rope},
          {"value_conv", c.design.value_conv},
          {"steps", c.steps},
          {"batch", c.batch},
          {"warmup", c.warmup},
          {"lr", c.lr},
          {"min_lr_ratio", c.min_lr_ratio},
          {"weight_decay", c.weight_decay},
          {"clip", c.clip},
          {"seed", c.seed},
          {"eval_every", c.eval_every},
          {"patience", c.patience},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"kv_pairs", c.kv_pairs},
          {"block", c.block},
          {"eval_samples", c.eval_samples},
          {"patch", c.patch},
          {"tile", c.tile},
          {"train_images", c.train_images},
          {"eval_images", c.eval_images}};
}

void check_run_config(const RunConfig& c) {
  auto positive = [](const char* name, int64_t value) {
    if (value <= 0)
      throw Error(std::string(name) + " must be positive (got " + std::to_string(value) + ")");
  };
  if (c.attention.empty()) throw Error("at least one attention layer is needed");
  positive("dim", c.dim);
  positive("heads", c.heads);
  positive("mlp_hidden", c.mlp_hidden);
  positive("steps", c.steps);
  positive("batch", c.batch);
  if (c.dim % c.heads != 0)
    throw Error("dim " + std::to_string(c.dim) + " is not divisible by heads " +
                std::to_string(c.heads));
  if (c.conv_kernel < 0) throw Error("conv_kernel must be >= 0");
  if (!(c.design.mixing_lr_scale > 0)) throw Error("mixing_lr_scale must be > 0");
  if (c.design.value_conv < 0) throw Error("value_conv must be >= 0");
  if (c.design.feature_map == FeatureMap::identity)
    throw Error(
        "feature_map identity can make a normalised row's denominator vanish; use relu or elu1");
  if (c.design.rope && (c.dim / c.heads) % 2 != 0)
    throw Error("rope needs an even head dimension (dim / heads = " +
                std::to_string(c.dim / c.heads) + ")");
  if (c.warmup < 0 || c.warmup >= c.steps) throw Error("warmup must be in [0, steps)");
  if (c.eval_every < 0 || c.patience < 0) throw Error("eval_every and patience must be >= 0");
  if (c.patience > 0 && c.eval_every == 0)
    throw Error("patience counts evaluations: early stopping needs eval_every > 0");
  if (!(c.lr > 0) || !(c.clip >= 0) || !(c.weight_decay >= 0) ||
      !(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1))
    throw Error("lr must be > 0, clip and weight_decay >= 0, min_lr_ratio in [0, 1]");
  if (is_sequence_task(c.task)) {
    if (c.block < 0) throw Error("block must be >= 0 (0: M = round(sqrt(seq_len)) blocks)");
    positive("seq_len", c.seq_len);
    positive("eval_samples", c.eval_samples);
    if (c.task == TaskKind::text && c.vocab != 256)
      throw Error("the text task reads bytes: vocab must be 256");
  } else {
    positive("patch", c.patch);
    positive("tile", c.tile);
    if (c.conv_kernel > 0)
      throw Error("the short convolution is causal 1D; use conv_kernel 0 for fashion-mnist");
    if (c.design.value_conv > 0 && c.design.value_conv % 2 == 0)
      throw Error("value_conv on images is a centred k x k convolution: k must be odd");
    if (c.train_images < 0 || c.eval_images < 0)
      throw Error("train_images and eval_images must be >= 0");
  }
}

int64_t sequence_block(const RunConfig& c) {
  if (c.block > 0) return c.block;
  const int64_t m = std::max<int64_t>(1, std::llround(std::sqrt(double(c.seq_len))));
  return (c.seq_len + m - 1) / m;
}

}  // namespace mhla::train
