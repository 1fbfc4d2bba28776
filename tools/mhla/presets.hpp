#pragma once
// The trainer's built-in settings per task: "quick" (the demo's comparison, a
// few minutes on 2 cores) and "full" (the documented comparison, about 90
// minutes on 2 cores). Both use the design the full runs found fair: the
// paper's M^2 ~ N blocks, a 10x learning rate on MHLA's mixing, uniform-causal
// mixing init for language tasks and the locality init for images.
#include <string>
#include <vector>

#include "train/run_config.hpp"

namespace mhla::tools {

train::RunConfig preset_config(train::TaskKind task, const std::string& preset);

// One row of a comparison: every model is trained once per seed; with more
// than one learning rate, the first seed picks each model's rate on the
// validation split and the other seeds use it.
struct ComparisonEntry {
  std::string label;  // e.g. "text KJV N=512"
  train::RunConfig config;
  std::vector<std::string> models;  // see apply_model in compare_command.cpp
  std::vector<double> learning_rates;
};
// tasks: text, fashion-mnist, mqar or all.
std::vector<ComparisonEntry> comparison_entries(const std::string& tasks,
                                                const std::string& preset);

}  // namespace mhla::tools
