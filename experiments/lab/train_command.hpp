#pragma once
// `mhla-lab train`: trains one small Transformer (MQAR or Fashion-MNIST) with a
// chosen attention per layer; writes a checkpoint, metrics.json and loss.png.
// `mhla-lab compare`: trains softmax, linear attention and MHLA models on the same
// task and seeds and prints the results table.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "design_flags.hpp"
#include "train/run_config.hpp"

namespace mhla::tools {

struct TrainCommand {
  std::string task = "mqar", preset = "full", attention, out_dir = "train-out", resume, data_dir;
  int64_t layers = 0, checkpoint_every = 0, stop_after = 0;
  int threads = 0;
  train::RunConfig overrides;  // copied into the preset's config for each flag given
  DesignFlagValues design;     // the attention design's flags, applied when given
  CLI::App* app = nullptr;
};
CLI::App* add_train_command(CLI::App& app, TrainCommand& command);
int run_train_command(const TrainCommand& command);

struct CompareCommand {
  std::string tasks = "all", preset = "quick", out_dir = "compare-out", data_dir;
  std::vector<std::string> attention;  // one entry per model; empty: the preset's
  std::vector<uint64_t> seeds;         // empty: the preset's
  std::vector<double> learning_rates;  // empty: the preset's
  std::vector<std::string> tables;     // labels of the tables to train; empty: all
  int threads = 0;
  int64_t steps = 0;      // > 0: every run takes this many steps (smoke tests)
  int64_t eval_size = 0;  // > 0: samples per evaluation split
  // > 0: the model size of every table and model instead of the preset's
  int64_t layers = 0, dim = 0, heads = 0, mlp_hidden = 0;
  DesignFlagValues design;
  CLI::App* app = nullptr;
};
CLI::App* add_compare_command(CLI::App& app, CompareCommand& command);
int run_compare_command(const CompareCommand& command);

}  // namespace mhla::tools
