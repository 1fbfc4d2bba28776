// The training loop: it learns, it is deterministic for a fixed seed and thread
// count, a resumed run continues exactly where the checkpoint stopped, and early
// stopping returns the model of the best evaluation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "mhla/error.hpp"
#include "small_runs.hpp"
#include "train/trainer.hpp"

namespace mhla::train {
namespace {

using test::small_mqar;

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(TrainTrainer, SameSeedSameRunDifferentSeedDifferentRun) {
  const RunConfig c = small_mqar({AttentionKind::mhla, AttentionKind::softmax});
  const RunResult a = run_training(c, {}), b = run_training(c, {});
  EXPECT_EQ(a.history.train_loss, b.history.train_loss);
  EXPECT_EQ(a.final_eval.loss, b.final_eval.loss);
  RunConfig other = c;
  other.seed = 6;
  EXPECT_NE(run_training(other, {}).history.train_loss, a.history.train_loss);
}

TEST(TrainTrainer, ResumeContinuesTheSameRunExactly) {
  for (AttentionKind kind : {AttentionKind::mhla, AttentionKind::linear, AttentionKind::softmax}) {
    const RunConfig c = small_mqar({kind, kind});
    const RunResult whole = run_training(c, {});
    const std::string path = (std::filesystem::temp_directory_path() /
                              (std::string("mhla_resume_") + to_string(kind) + ".safetensors"))
                                 .string();
    RunOptions first;
    first.checkpoint = path;
    first.stop_after = 5;
    const RunResult part = run_training(c, first);
    EXPECT_FALSE(part.finished);
    EXPECT_EQ(part.steps_done, 5);
    RunOptions second;
    second.checkpoint = path;
    second.resume = path;
    const RunResult rest = run_training(c, second);
    EXPECT_TRUE(rest.finished);
    EXPECT_EQ(rest.history.train_loss, whole.history.train_loss) << to_string(kind);
    EXPECT_EQ(rest.final_eval.loss, whole.final_eval.loss) << to_string(kind);
    // Resuming a finished run trains nothing more and reports the same result.
    const RunResult again = run_training(c, second);
    EXPECT_EQ(again.history.train_loss.size(), size_t(c.steps));
    EXPECT_EQ(again.final_eval.loss, whole.final_eval.loss);
    std::filesystem::remove(path);
  }
}

TEST(TrainTrainer, ResumeRefusesAnotherRunsCheckpoint) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "mhla_resume_other.safetensors").string();
  RunOptions save;
  save.checkpoint = path;
  save.stop_after = 2;
  run_training(small_mqar({AttentionKind::mhla}), save);
  RunOptions resume;
  resume.resume = path;
  EXPECT_THAT([&] { run_training(small_mqar({AttentionKind::linear}), resume); },
              ThrowsMessage<Error>(HasSubstr("attention \"mhla\" vs \"linear\"")));
  std::filesystem::remove(path);
}

// A run that evaluates every step at a rate high enough for validation to stop
// improving within its 40 steps.
RunConfig early_stopping_run() {
  RunConfig c = small_mqar({AttentionKind::mhla, AttentionKind::linear});
  c.steps = 40;
  c.lr = 3e-2;
  c.eval_every = 1;
  c.patience = 3;
  return c;
}

TEST(TrainTrainer, EarlyStoppingReturnsTheModelOfTheBestEvaluation) {
  const RunConfig c = early_stopping_run();
  EvalPoint returned;
  RunOptions options;
  options.on_finish = [&](Model<float>& model, const Task& task) {
    returned = evaluate(model, task.validation_batches(), 0);
  };
  const RunResult r = run_training(c, options);
  ASSERT_TRUE(r.finished);
  ASSERT_TRUE(r.stopped_early) << "validation kept improving; the test needs a run that stops";
  EXPECT_LT(r.steps_done, c.steps);
  const std::vector<EvalPoint>& eval = r.history.eval;
  ASSERT_EQ(int64_t(eval.size()), r.steps_done);
  const int64_t best = best_evaluation(eval, false);
  // It stopped exactly `patience` evaluations after the best one ...
  EXPECT_EQ(int64_t(eval.size()) - 1 - best, c.patience);
  EXPECT_EQ(r.final_eval.step, eval[size_t(best)].step);
  EXPECT_EQ(r.final_eval.accuracy, eval[size_t(best)].accuracy);
  // ... and the model it hands on is that evaluation's, not the last one.
  EXPECT_EQ(returned.loss, eval[size_t(best)].loss);
  EXPECT_NE(returned.loss, eval.back().loss);
}

TEST(TrainTrainer, AnEarlyStoppedRunResumesToTheSameResult) {
  const RunConfig c = early_stopping_run();
  const RunResult whole = run_training(c, {});
  ASSERT_TRUE(whole.stopped_early);
  const std::string path =
      (std::filesystem::temp_directory_path() / "mhla_resume_early_stopping.safetensors").string();
  RunOptions first;
  first.checkpoint = path;
  // Past the best evaluation, so that the checkpoint must carry the best parameters.
  first.stop_after = whole.final_eval.step + 1;
  ASSERT_LT(first.stop_after, whole.steps_done);
  EXPECT_FALSE(run_training(c, first).finished);
  RunOptions second;
  second.checkpoint = path;
  second.resume = path;
  const RunResult rest = run_training(c, second);
  EXPECT_TRUE(rest.stopped_early);
  EXPECT_EQ(rest.steps_done, whole.steps_done);
  EXPECT_EQ(rest.history.train_loss, whole.history.train_loss);
  EXPECT_EQ(rest.final_eval.step, whole.final_eval.step);
  EXPECT_EQ(rest.final_test.loss, whole.final_test.loss);
  // A finished, early-stopped run trains no further when resumed.
  const RunResult again = run_training(c, second);
  EXPECT_EQ(again.steps_done, whole.steps_done);
  EXPECT_EQ(again.final_test.loss, whole.final_test.loss);
  std::filesystem::remove(path);
}

TEST(TrainTrainer, TheBestEvaluationBreaksAccuracyTiesByLoss) {
  const std::vector<EvalPoint> eval = {{1, 0.9, 0.5}, {2, 0.7, 0.6}, {3, 0.6, 0.6}, {4, 0.5, 0.4}};
  EXPECT_EQ(best_evaluation(eval, false), 2);  // 60% twice: the lower loss wins
  EXPECT_EQ(best_evaluation(eval, true), 3);   // by loss alone
  EXPECT_EQ(best_evaluation({}, false), -1);
  const std::vector<EvalPoint> equal = {{1, 0.5, 0.5}, {2, 0.5, 0.5}};
  EXPECT_EQ(best_evaluation(equal, false), 0);  // an equal score is no improvement
}

TEST(TrainTrainer, LearnsToRecallAShortSequence) {
  // Two softmax layers learn MQAR with 4 pairs in 32 tokens (chance: 1/16); this
  // setting reaches about 98% on the evaluation set.
  RunConfig c = small_mqar({AttentionKind::softmax, AttentionKind::softmax});
  c.dim = 32;
  c.mlp_hidden = 64;
  c.steps = 200;
  c.warmup = 20;
  c.batch = 16;
  c.lr = 1e-2;
  c.eval_samples = 64;
  const RunResult r = run_training(c, {});
  EXPECT_LT(r.history.train_loss.back(), r.history.train_loss.front() * 0.2);
  EXPECT_GT(r.final_eval.accuracy, 0.8);
}

TEST(TrainTrainer, BadSettingsAreNamedErrors) {
  RunConfig c = small_mqar({AttentionKind::mhla});
  c.dim = 15;
  EXPECT_THAT([&] { run_training(c, {}); },
              ThrowsMessage<Error>(HasSubstr("dim 15 is not divisible by heads 2")));
  c = small_mqar({AttentionKind::mhla});
  c.kv_pairs = 20;
  EXPECT_THAT([&] { run_training(c, {}); }, ThrowsMessage<Error>(HasSubstr("vocabulary")));
  c = small_mqar({AttentionKind::mhla});
  c.patience = 2;
  EXPECT_THAT([&] { run_training(c, {}); },
              ThrowsMessage<Error>(HasSubstr("early stopping needs eval_every > 0")));
  EXPECT_THAT([] { parse_task("cifar"); },
              ThrowsMessage<Error>(
                  HasSubstr("unknown task 'cifar'; expected mqar, fashion-mnist or text")));
  for (TaskKind t : {TaskKind::mqar, TaskKind::fashion_mnist, TaskKind::text})
    EXPECT_EQ(parse_task(to_string(t)), t);
  c = small_mqar({AttentionKind::mhla});
  c.task = TaskKind::fashion_mnist;
  c.conv_kernel = 0;
  RunOptions missing;
  missing.data_dir = "/nonexistent";
  EXPECT_THAT([&] { run_training(c, missing); },
              ThrowsMessage<Error>(HasSubstr("/nonexistent/train-images")));
}

}  // namespace
}  // namespace mhla::train
