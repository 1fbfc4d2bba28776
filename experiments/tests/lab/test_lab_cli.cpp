// The `mhla-lab` program end to end: training runs stop, resume and write
// their outputs; comparisons widen their grid, continue where they stopped,
// train only the tables named and measure every model against the baseline;
// bad settings are one-line errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/child_process.hpp"

namespace mhla::lab::test {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using testing::Not;

using LabRun = tools::CommandRun;

LabRun mhla_lab(const std::string& args) { return tools::run_command(MHLA_LAB " " + args); }

// Each test writes into a fresh directory named after it.
class LabCli : public testing::Test {
 protected:
  void SetUp() override {
    const std::string test = testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::path(testing::TempDir()) / ("mhla-lab-" + test);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// A tiny run's flags, shared by the train and resume steps below.
const std::string kTinyTrain =
    "train --task mqar --attention mhla,softmax --dim 8 --heads 2 --mlp 8 --conv 2 --steps 6 "
    "--warmup 1 --batch 2 "
    "--vocab 16 --seq-len 16 --kv-pairs 2 --block 4 --eval-samples 4 --threads 1 ";

TEST_F(LabCli, TrainStopsResumesAndWritesItsOutputs) {
  const LabRun whole = mhla_lab(kTinyTrain + "--out " + path("whole"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  EXPECT_THAT(whole.output, HasSubstr("final evaluation: validation loss"));
  for (const char* name : {"checkpoint.safetensors", "metrics.json", "loss.png"})
    EXPECT_TRUE(fs::exists(path("whole/" + std::string(name)))) << name;

  const LabRun part = mhla_lab(kTinyTrain + "--stop-after 3 --out " + path("split"));
  ASSERT_EQ(part.status, 0) << part.output;
  EXPECT_THAT(part.output, HasSubstr("stopped before the end; continue with --resume"));
  const LabRun rest = mhla_lab(kTinyTrain + "--out " + path("split") + " --resume " +
                               path("split/checkpoint.safetensors"));
  ASSERT_EQ(rest.status, 0) << rest.output;
  auto history = [&](const std::string& dir) {
    std::ifstream in(path(dir + "/metrics.json"));
    return nlohmann::json::parse(in)["history"];
  };
  // metrics.json keeps the smoothed curve, not the per-step losses (the checkpoint has those).
  EXPECT_FALSE(history("whole").contains("train_loss"));
  EXPECT_EQ(history("whole")["train_curve"]["step"].back(), 6);
  EXPECT_EQ(history("split")["train_curve"], history("whole")["train_curve"]);
  EXPECT_EQ(history("split")["eval"], history("whole")["eval"]);

  // Another run's checkpoint, or a damaged one, is a one-line error.
  const LabRun other = mhla_lab(kTinyTrain + "--seed 9 --out " + path("other") + " --resume " +
                                path("whole/checkpoint.safetensors"));
  EXPECT_EQ(other.status, 1);
  EXPECT_THAT(other.output, HasSubstr("seed 0 vs 9"));
  {
    std::ofstream damaged(path("damaged.safetensors"), std::ios::binary);
    damaged.write("\x10\0\0\0\0\0\0\0{\"a\":", 13);  // promises a 16-byte header, holds 5
  }
  const LabRun bad =
      mhla_lab(kTinyTrain + "--out " + path("bad") + " --resume " + path("damaged.safetensors"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output, HasSubstr("damaged.safetensors"));
}

TEST_F(LabCli, CompareWidensTheGridAndContinuesAStoppedComparison) {
  const std::string compare =
      "compare --preset full --tasks mqar --steps 4 --eval-size 8 --seeds 0,1 --lrs 1e-3,2e-3 "
      "--threads 1 --out " +
      path("c");
  const LabRun first = mhla_lab(compare);
  ASSERT_EQ(first.status, 0) << first.output;
  std::ifstream in(path("c/compare.json"));
  const nlohmann::json report = nlohmann::json::parse(in);
  int runs = 0;
  for (const auto& model : report["entries"][0]["models"]) {
    // The chosen rate has the best validation score of the sweep, and lies
    // inside the tried rates unless the grid was widened as far as it goes.
    const auto& sweep = model["sweep"];
    double best = -1;
    for (const auto& s : sweep) best = std::max(best, s["validation"].get<double>());
    int below = 0, above = 0;
    for (const auto& s : sweep) {
      if (s["lr"] == model["lr"]) {
        EXPECT_EQ(s["validation"].get<double>(), best);
      }
      below += s["lr"].get<double>() < model["lr"].get<double>();
      above += s["lr"].get<double>() > model["lr"].get<double>();
    }
    EXPECT_GE(sweep.size(), 2u);
    EXPECT_EQ(model["lr_inside_grid"].get<bool>(), below > 0 && above > 0);
    if (!model["lr_inside_grid"].get<bool>()) {
      EXPECT_EQ(sweep.size(), 2u + 3u);
    }
    EXPECT_EQ(model["test"].size(), 2u);
    // The sweep, then each seed at the chosen rate; the first seed's run is the
    // sweep's own (read back), as the rate is chosen by full runs here.
    runs += int(sweep.size()) + 2;
  }
  ASSERT_EQ(report["entries"][0]["paired_test_differences"].size(), 1u);
  EXPECT_EQ(report["entries"][0]["paired_test_differences"][0]["per_seed"].size(), 2u);

  // Run again: every run is read back, none trains, and the tables are the same.
  auto tables = [&] {
    std::ifstream md(path("c/compare.md"));
    std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
    return text.substr(text.find('\n'));  // without the caption's timing
  };
  const std::string before = tables();
  // A run recorded with its per-step history, as metrics files once were, is read back too.
  {
    char chosen[32];
    std::snprintf(chosen, sizeof chosen, "%g",
                  report["entries"][0]["models"][0]["lr"].get<double>());
    const fs::path first =
        fs::path(path("c")) / "mqar_N_256_kv_8" / ("linear-lr" + std::string(chosen) + "-seed0");
    std::ifstream in(first / "metrics.json");
    nlohmann::json metrics = nlohmann::json::parse(in);
    in.close();
    const int64_t steps = metrics["steps_done"].get<int64_t>();
    metrics["history"].erase("train_curve");
    metrics["history"]["train_loss"] = std::vector<double>(size_t(steps), 1.0);
    metrics["history"]["train_accuracy"] = std::vector<double>(size_t(steps), 0.0);
    std::ofstream(first / "metrics.json") << metrics.dump(2);
  }
  const LabRun again = mhla_lab(compare);
  ASSERT_EQ(again.status, 0) << again.output;
  size_t read_back = 0;
  for (size_t at = 0; (at = again.output.find("(read back)", at)) != std::string::npos; ++at)
    ++read_back;
  EXPECT_EQ(int(read_back), runs) << again.output;
  EXPECT_THAT(again.output, Not(HasSubstr(" tok/s")));  // no training step printed
  EXPECT_EQ(tables(), before);

  // A run whose metrics are gone is trained again; the others are read back.
  char lr[32];
  std::snprintf(lr, sizeof lr, "%g", report["entries"][0]["models"][1]["lr"].get<double>());
  const fs::path one =
      fs::path(path("c")) / "mqar_N_256_kv_8" / ("mhla-lr" + std::string(lr) + "-seed1");
  ASSERT_TRUE(fs::remove(one / "metrics.json"));
  fs::remove(one / "checkpoint.safetensors");
  const LabRun third = mhla_lab(compare);
  ASSERT_EQ(third.status, 0) << third.output;
  EXPECT_THAT(third.output, HasSubstr(" tok/s"));
  EXPECT_THAT(third.output, HasSubstr("seed 1: validation"));
  EXPECT_EQ(tables(), before);
}

TEST_F(LabCli, CompareTakesOneModelSizeForEveryModel) {
  const std::string compare =
      "compare --preset full --tasks mqar --steps 2 --eval-size 4 --seeds 0 --lrs 1e-3 "
      "--threads 1 --layers 3 --dim 16 --heads 4 --mlp 24 --attention softmax,linear ";
  const LabRun r = mhla_lab(compare + "--out " + path("sized"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(path("sized/compare.json"));
  const nlohmann::json entry = nlohmann::json::parse(in)["entries"][0];
  EXPECT_EQ(entry["config"]["dim"], 16);
  EXPECT_EQ(entry["config"]["heads"], 4);
  EXPECT_EQ(entry["config"]["mlp_hidden"], 24);
  for (const char* model : {"softmax", "linear"}) {
    std::ifstream metrics(
        path("sized/mqar_N_256_kv_8/" + std::string(model) + "-lr0.001-seed0/metrics.json"));
    const nlohmann::json config = nlohmann::json::parse(metrics)["config"];
    EXPECT_EQ(config["attention"], std::string(model) + "," + model + "," + model);
    EXPECT_EQ(config["dim"], 16);
    EXPECT_EQ(config["mlp_hidden"], 24);
  }
  std::ifstream md(path("sized/compare.md"));
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("3 layers of width 16, 4 heads, MLP 24"));
  // Softmax is in the table and MHLA is not: neither note applies.
  EXPECT_THAT(text, Not(HasSubstr("softmax is not in this table")));
  EXPECT_THAT(text, Not(HasSubstr("MHLA starts here as exactly linear attention")));

  // A model that lists its layers must list as many as --layers asks for.
  const LabRun bad = mhla_lab(
      "compare --preset full --tasks mqar --layers 3 --attention "
      "linear/mhla --out " +
      path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output, HasSubstr("--layers 3 but the model 'linear/mhla' lists 2 layers"));
}

TEST_F(LabCli, CompareTrainsOnlyTheTablesNamed) {
  const std::string compare =
      "compare --preset full --tasks all --steps 2 --eval-size 4 --seeds 0 --lrs 1e-3 "
      "--threads 1 --dim 8 --heads 2 --mlp 8 ";
  const LabRun r = mhla_lab(compare + "--tables 'mqar N=256 kv=8' --out " + path("one"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(path("one/compare.json"));
  const nlohmann::json entries = nlohmann::json::parse(in)["entries"];
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["label"], "mqar N=256 kv=8");
  EXPECT_FALSE(fs::exists(path("one/text_KJV_N_512")));
  // The table says what its rows do not: MHLA's start on a causal task, the
  // absent softmax, and what a causal matrix's rank means.
  std::ifstream md(path("one/compare.md"));
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("MHLA starts here as exactly linear attention"));
  EXPECT_THAT(text, HasSubstr("softmax is not in this table"));
  EXPECT_THAT(text, HasSubstr("so it has full rank whatever the attention"));

  const LabRun bad =
      mhla_lab(compare + "--tables 'mqar N=256,text KJV N=512' --out " + path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output,
              HasSubstr("--tables: no table 'mqar N=256' in this comparison; its tables "
                        "are 'text KJV N=512', "));
  EXPECT_FALSE(fs::exists(path("bad/text_KJV_N_512")));
}

TEST_F(LabCli, CompareMeasuresEveryModelAgainstTheBaselineTable) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's fashion-mnist package is not installed";
  const std::string compare =
      "compare --preset plateau --steps 2 --eval-size 16 --seeds 0,1 --lrs 1e-3 --threads 1 "
      "--dim 8 --heads 2 --mlp 8 --attention softmax,mhla ";
  const LabRun r = mhla_lab(
      compare + "--tables 'fashion-mnist 1 token,fashion-mnist 196 tokens' --out " + path("b"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(path("b/compare.json"));
  const nlohmann::json entries = nlohmann::json::parse(in)["entries"];
  ASSERT_EQ(entries.size(), 2u);
  // The baseline table is not measured against itself (its mhla − softmax
  // only).
  ASSERT_EQ(entries[0]["paired_test_differences"].size(), 1u);
  EXPECT_FALSE(entries[0]["paired_test_differences"][0].contains("subtrahend_table"));
  const nlohmann::json& baseline = entries[0]["models"][0];
  ASSERT_EQ(baseline["attention"], "softmax");
  // One rate leaves nothing to choose: no short sweep run trains before the
  // seeds' runs.
  EXPECT_TRUE(baseline["sweep"].empty());
  EXPECT_TRUE(fs::exists(path("b/fashion-mnist_196_tokens/mhla-lr0.001-seed0/metrics.json")));
  EXPECT_FALSE(fs::exists(path("b/fashion-mnist_196_tokens/mhla-lr0.001-seed0-sweep")));
  // The 196-token table: mhla − softmax, then each model minus the baseline's
  // first model, seed by seed, in accuracy points.
  const nlohmann::json& differences = entries[1]["paired_test_differences"];
  ASSERT_EQ(differences.size(), 3u);
  EXPECT_FALSE(differences[0].contains("subtrahend_table"));
  std::ifstream md(path("b/compare.md"));
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("| 0.001 (given) |"));
  for (size_t m = 0; m < 2; ++m) {
    const nlohmann::json& d = differences[1 + m];
    const nlohmann::json& model = entries[1]["models"][m];
    EXPECT_EQ(d["minuend"], model["attention"]);
    EXPECT_EQ(d["subtrahend"], "softmax");
    EXPECT_EQ(d["subtrahend_table"], "fashion-mnist 1 token");
    for (size_t s = 0; s < 2; ++s)
      EXPECT_NEAR(d["per_seed"][s].get<double>(),
                  100 * (model["test"][s].get<double>() - baseline["test"][s].get<double>()), 1e-9);
    EXPECT_THAT(text, HasSubstr("| " + model["attention"].get<std::string>() +
                                " − fashion-mnist 1 token | "));
  }
  // Without the baseline table in the command, no such rows.
  const LabRun alone = mhla_lab(compare + "--tables 'fashion-mnist 196 tokens' --out " + path("b"));
  ASSERT_EQ(alone.status, 0) << alone.output;
  std::ifstream again(path("b/compare.json"));
  EXPECT_EQ(nlohmann::json::parse(again)["entries"][0]["paired_test_differences"].size(), 1u);
}

TEST_F(LabCli, TrainOneKindFillsTheDepth) {
  const std::string tiny =
      "train --dim 8 --heads 2 --mlp 8 --steps 2 --warmup 0 --batch 2 --vocab 16 --seq-len 16 "
      "--kv-pairs 2 "
      "--block 4 --eval-samples 2 --attention linear ";
  auto layers = [&](const std::string& extra, const std::string& dir) {
    const LabRun r = mhla_lab(tiny + extra + "--out " + path(dir));
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(path(dir + "/metrics.json"));
    return nlohmann::json::parse(in)["config"]["attention"].get<std::string>();
  };
  EXPECT_EQ(layers("", "preset"), "linear,linear");  // the preset's two layers
  EXPECT_EQ(layers("--layers 3 ", "three"), "linear,linear,linear");
}

TEST_F(LabCli, TrainRejectsBadSettings) {
  const LabRun r = mhla_lab("train --task mqar --attention mhla,bogus --out " + path("x"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("unknown attention 'bogus'"));
  const LabRun layers = mhla_lab("train --attention mhla,linear --layers 3 --out " + path("z"));
  EXPECT_EQ(layers.status, 1);
  EXPECT_THAT(layers.output, HasSubstr("--layers 3 but --attention lists 2 layers"));
  const LabRun fm = mhla_lab("train --task fashion-mnist --data " + path("none") +
                             " --steps 2 --warmup 0 --out " + path("y"));
  EXPECT_EQ(fm.status, 1);
  EXPECT_THAT(fm.output, HasSubstr("apt-get install dataset-fashion-mnist"));
}

}  // namespace
}  // namespace mhla::lab::test
