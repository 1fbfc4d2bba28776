#pragma once
// What `mhla train` and `mhla compare` write and print about a run.
#include <optional>
#include <string>
#include <vector>

#include "train/trainer.hpp"

namespace mhla::tools {

// Runs one training with a progress bar (step, loss, tokens/s) titled `title`.
train::RunResult run_with_progress(const train::RunConfig& config, train::RunOptions options,
                                   const std::string& title);

// metrics.json: config, threads, final evaluation, run time, throughput, history.
void write_run_metrics(const std::string& path, const train::RunConfig& config,
                       const train::RunResult& result, int threads);

// The run recorded in metrics.json at `path` when it finished with exactly this
// config; nothing when the file is missing, unfinished or from other settings.
// mhla::Error when the file exists but cannot be read as metrics.
std::optional<train::RunResult> read_finished_run(const std::string& path,
                                                  const train::RunConfig& config);

// An M x M mixing matrix W (row i: query block, column b: key block) as a PNG
// with a colour bar of its values.
void write_mixing_png(const std::string& png, const std::string& title, const std::vector<float>& w,
                      int64_t m);

struct LossSeries {
  std::string title;
  std::vector<double> train_loss;  // per step; drawn smoothed
  std::vector<train::EvalPoint> eval;
};
// Training loss (exponential moving average) and evaluation loss against step,
// one colour per series; log-scale loss.
void write_loss_png(const std::string& png, const std::string& title,
                    const std::vector<LossSeries>& series);

}  // namespace mhla::tools
