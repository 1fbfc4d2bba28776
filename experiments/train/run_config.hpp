#pragma once
// Everything that decides a training run's result. Checkpoints store it, and a
// resume is refused unless it matches (so "resume" always continues the same run).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/attention_layer.hpp"

namespace mhla::train {

// The task a run trains on (the names are those of the command line and the
// checkpoints: "mqar", "fashion-mnist", "text").
enum class TaskKind { mqar, fashion_mnist, text };
const char* to_string(TaskKind task);
TaskKind parse_task(const std::string& name);  // mhla::Error listing the names

struct RunConfig {
  TaskKind task = TaskKind::mqar;
  std::vector<AttentionKind> attention{AttentionKind::mhla, AttentionKind::mhla};  // one per layer
  int64_t dim = 64, heads = 2, mlp_hidden = 128, conv_kernel = 4;
  int64_t steps = 1000, batch = 32, warmup = 100;
  AttentionDesign
      design;  // mixing parametrisation and init, feature map, head, rotary, positional term
  double lr = 1e-3, min_lr_ratio = 0.1, weight_decay = 0.1, clip = 1.0;
  uint64_t seed = 0;
  // Validation every eval_every steps (0: at the end only). With patience > 0 the
  // run stops after `patience` evaluations without a better validation score
  // (early stopping), and its result is the model at its best evaluation; the
  // cadence is part of the config because it decides where a run can stop.
  int64_t eval_every = 0, patience = 0;
  // sequence tasks, mqar and text (seq_len: the context; eval_samples: sequences per evaluation
  // split); block 0 = the paper's M^2 ~ N: M = round(sqrt(seq_len)) blocks
  int64_t vocab = 256, seq_len = 256, kv_pairs = 16, block = 0, eval_samples = 512;
  // fashion-mnist: patch x patch pixels per token, tile x tile tokens per MHLA block;
  // 0 images = the whole split
  int64_t patch = 2, tile = 7, train_images = 0, eval_images = 0;
};

nlohmann::json to_json(const RunConfig& config);
// "softmax,linear,mhla" -> one kind per layer.
std::vector<AttentionKind> parse_attention_list(const std::string& text);
std::string attention_list_name(const std::vector<AttentionKind>& kinds);
// Throws mhla::Error naming the first field that cannot work.
void check_run_config(const RunConfig& config);
// Whether a task's score is its loss (text: bits per byte, lower is better)
// rather than its accuracy (higher is better).
bool scored_by_loss(TaskKind task);
// Whether the task is a token sequence (mqar, text) rather than images.
bool is_sequence_task(TaskKind task);
// The block length a sequence task uses: `block`, or for 0 the length that
// makes M = round(sqrt(seq_len)) blocks.
int64_t sequence_block(const RunConfig& config);

}  // namespace mhla::train
