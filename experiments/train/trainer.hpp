#pragma once
// The training loop: AdamW with warm-up + cosine decay and gradient clipping,
// periodic evaluation, early stopping, checkpoints and resume. Results depend only on the run
// config and the thread count.
#include <functional>
#include <string>

#include "train/history.hpp"
#include "train/run_config.hpp"
#include "train/task.hpp"

namespace mhla::train {

struct RunOptions {
  std::string data_dir;          // Fashion-MNIST folder; empty: the Debian package's
  std::string checkpoint;        // written every checkpoint_every steps and at the end; empty: none
  std::string resume;            // checkpoint to continue from; empty: start fresh
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t stop_after = 0;        // > 0: stop (with a checkpoint) once this many steps are done
  // Called after every step: (steps done, steps total, loss, tokens per second).
  std::function<void(int64_t, int64_t, double, double)> on_step;
  // Called once the run has finished, with the trained model and its task (diagnostics).
  std::function<void(Model<float>&, const Task&)> on_finish;
};

struct RunResult {
  History history;
  int64_t steps_done = 0;
  int64_t parameters = 0;
  double tokens_per_second = 0;  // this invocation's training steps only
  bool finished = false;         // all steps done, or stopped early, and evaluated
  bool stopped_early = false;    // finished by early stopping before the last step
  // Valid when finished: the validation score of the model the run returns (the
  // last one, or with early stopping the best evaluation's, which
  // final_eval.step names) and that model's score on the test split.
  EvalPoint final_eval;
  EvalPoint final_test;
};

RunResult run_training(const RunConfig& config, const RunOptions& options);

// The model's mean loss and accuracy over the labelled positions of `batches`,
// recorded as an evaluation after `step` steps.
EvalPoint evaluate(Model<float>& model, const std::vector<Batch>& batches, int64_t step);

}  // namespace mhla::train
