#pragma once
// Training checkpoints as safetensors: the parameters ("model/<name>"), AdamW's
// moments ("adam_m/<name>", "adam_v/<name>"), with early stopping the best
// evaluation's parameters ("best/<name>"), and in the metadata the run
// config, the step count and the history. Loading checks everything against the
// run being resumed and names what does not match.
#include <string>

#include "train/history.hpp"
#include "train/model.hpp"
#include "train/optimizer.hpp"
#include "train/run_config.hpp"

namespace mhla::train {

struct TrainingState {
  int64_t step = 0;  // steps completed
  History history;
  // With early stopping: the parameters at the best evaluation so far, in the
  // model's parameter order ("best/<name>" in the file); empty otherwise.
  std::vector<std::vector<float>> best_parameters;
};

void save_checkpoint(const std::string& path, const RunConfig& config, const Model<float>& model,
                     AdamW<float>& optimizer, const TrainingState& state);

// Restores model and optimizer in place and returns the step and history.
TrainingState load_checkpoint(const std::string& path, const RunConfig& config, Model<float>& model,
                              AdamW<float>& optimizer);

}  // namespace mhla::train
