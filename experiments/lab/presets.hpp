#pragma once
// The trainer's built-in settings per task: "quick" (the demo's comparison, a
// few minutes on 2 cores), "full" (the short-budget comparison of all three
// tasks) and "plateau" (Fashion-MNIST at 196 tokens on every image, trained
// until validation stops improving). All use the design the short runs found
// fair: the paper's M^2 ~ N blocks, a 10x learning rate on MHLA's mixing,
// uniform-causal mixing init for language tasks and the locality init for
// images.
#include <string>
#include <vector>

#include "train/run_config.hpp"

namespace mhla::tools {

train::RunConfig preset_config(train::TaskKind task, const std::string& preset);

// One table of a comparison: every model is trained once per seed; with more
// than one learning rate, the first seed picks each model's rate on the
// validation split and the other seeds use it.
struct ComparisonEntry {
  std::string label;  // e.g. "text KJV N=512"
  train::RunConfig config;
  std::vector<std::string> models;  // see apply_model in compare_command.cpp
  std::vector<double> learning_rates;
  // > 0: the rate is chosen by runs of this many steps (the same schedule,
  // compressed); 0: by the first seed's full runs.
  int64_t sweep_steps = 0;
  // A reference model for the tables after it (the one-token MLP on the
  // pixels): their models' test scores are also reported minus its first
  // model's, seed by seed.
  bool baseline = false;
};
// tasks: text, fashion-mnist, mqar or all (plateau: fashion-mnist or all).
std::vector<ComparisonEntry> comparison_entries(const std::string& tasks,
                                                const std::string& preset);

}  // namespace mhla::tools
