// The training loop: it learns, it is deterministic for a fixed seed and thread
// count, and a resumed run continues exactly where the checkpoint stopped.
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
