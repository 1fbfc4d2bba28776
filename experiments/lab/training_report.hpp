#pragma once
// What `mhla-lab train` and `mhla-lab compare` write and print about a run.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/trainer.hpp"

namespace mhla::tools {

// Runs one training with a progress bar (step, loss, tokens/s) titled `title`.
train::RunResult run_with_progress(const train::RunConfig& config, train::RunOptions options,
                                   const std::string& title);

// The training loss as the loss plots draw it: the per-step losses under a
// moving average over ~2% of the run, at `points` (step, loss) pairs evenly
// spaced over the steps, the last one included; losses to 5 digits.
using LossCurve = std::vector<std::pair<double, double>>;
LossCurve smoothed_train_loss(const std::vector<double>& per_step, size_t points = 100);

// metrics.json: config, threads, final evaluation, run time, throughput, and
// the history as a summary: the smoothed training curve and every evaluation
// (the per-step losses stay in the run's checkpoint, which resumes it).
void write_run_metrics(const std::string& path, const train::RunConfig& config,
                       const train::RunResult& result, int threads);

// A finished run as metrics.json records it: its result (its history without
// per-step losses) and its smoothed training curve.
struct FinishedRun {
  train::RunResult result;
  LossCurve train_curve;
};

// The run recorded in metrics.json at `path` when it finished with exactly this
// config; nothing when the file is missing, unfinished or from other settings.
// mhla::Error when the file exists but cannot be read as metrics. Files that
// hold the per-step history (as they once did) are read too.
std::optional<FinishedRun> read_finished_run(const std::string& path,
                                             const train::RunConfig& config);

// An M x M mixing matrix W (row i: query block, column b: key block) as a PNG
// with a colour bar of its values.
void write_mixing_png(const std::string& png, const std::string& title, const std::vector<float>& w,
                      int64_t m);

struct LossSeries {
  std::string title;
  LossCurve train_curve;  // smoothed_train_loss
  std::vector<train::EvalPoint> eval;
};
// Training loss (smoothed) and evaluation loss against step, one colour per
// series; log-scale loss.
void write_loss_png(const std::string& png, const std::string& title,
                    const std::vector<LossSeries>& series);

}  // namespace mhla::tools
