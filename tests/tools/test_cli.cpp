// The `mhla` program end to end: forward/backward on .npy files written here
// agree with the library, analyze and bench write their files, and bad input
// fails with a one-line error naming the file, overwriting nothing.
#include <cblas.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/npy.hpp"
#include "common/openblas_core.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using testing::Not;
using tools::DType;

struct CliRun {
  int status;
  std::string output;  // stdout and stderr
};

// `environment`: `env` arguments the program runs under ("-u NAME", "NAME=VALUE").
// By default it runs on this process's OpenBLAS kernels, which it would
// otherwise replace on a CPU OpenBLAS does not know, so that its results
// and the library's here agree to the bit.
CliRun mhla_cli(const std::string& args, const std::string& environment = "") {
  const std::string pinned = std::string("OPENBLAS_CORETYPE=") + openblas_get_corename();
  const std::string command = "env " + (environment.empty() ? pinned : environment) + " " +
                              MHLA_CLI + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[1024];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class Cli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("mhla-cli-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// [B, N, H, D] -> [B, H, N, D]
std::vector<double> heads_first(const std::vector<double>& x, int64_t b, int64_t n, int64_t h,
                                int64_t d) {
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < h; ++j)
        for (int64_t e = 0; e < d; ++e)
          out[((i * h + j) * n + t) * d + e] = x[((i * n + t) * h + j) * d + e];
  return out;
}

TEST_F(Cli, ForwardOnPyTorchOrderedFilesMatchesTheLibrary) {
  Case c{"2d", 2, 3, 4, 5, TokenLayout::grid2d(5, 6, 2, 3)};
  const Inputs in = make_inputs(c, 2);
  const int64_t b = c.batch, n = c.tokens(), h = c.heads;
  tools::write_npy(
      path("q.npy"),
      tools::NpyArray::of(DType::f64, {b, h, n, c.dk}, heads_first(in.q, b, n, h, c.dk)), false);
  tools::write_npy(
      path("k.npy"),
      tools::NpyArray::of(DType::f64, {b, h, n, c.dk}, heads_first(in.k, b, n, h, c.dk)), false);
  tools::write_npy(
      path("v.npy"),
      tools::NpyArray::of(DType::f64, {b, h, n, c.dv}, heads_first(in.v, b, n, h, c.dv)), false);
  tools::write_npy(path("w.npy"), tools::NpyArray::of(DType::f64, c.w_shape(), in.w), false);
  const CliRun r = mhla_cli("forward --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                            path("v.npy") + " --w " + path("w.npy") +
                            " --order bhnd --grid 5x6 --tile 2x3 --out-dir " + path("out"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<double> want(in.v.size());
  forward<double>(c.options(), view(in.q, c.q_shape()), view(in.k, c.q_shape()),
                  view(in.v, c.v_shape()), view(in.w, c.w_shape()), view(want, c.v_shape()));
  const tools::NpyArray o = tools::read_npy(path("out/o.npy"));
  EXPECT_EQ(o.dtype(), DType::f64);
  EXPECT_EQ(o.shape, (std::vector<int64_t>{b, h, n, c.dv}));
  EXPECT_CLOSE(o.as<double>(), heads_first(want, b, n, h, c.dv), 1e-14, "o");
}

TEST_F(Cli, BackwardWithToeplitzMixingMatchesTheLibrary) {
  Case c{"1d", 1, 2, 3, 3, TokenLayout::sequence(21, 4), Masking::causal};
  c.toeplitz_length = 2;
  Inputs in = make_inputs(c, 4);
  auto f32 = [](std::vector<double> x) {
    for (double& e : x) e = double(float(e));
    return x;
  };
  in.q = f32(in.q), in.k = f32(in.k), in.v = f32(in.v), in.grad_o = f32(in.grad_o),
  in.w = f32(in.w);
  tools::write_npy(path("q.npy"), tools::NpyArray::of(DType::f32, c.q_shape(), in.q), false);
  tools::write_npy(path("k.npy"), tools::NpyArray::of(DType::f32, c.q_shape(), in.k), false);
  tools::write_npy(path("v.npy"), tools::NpyArray::of(DType::f32, c.v_shape(), in.v), false);
  tools::write_npy(path("g.npy"), tools::NpyArray::of(DType::f32, c.v_shape(), in.grad_o), false);
  tools::write_npy(path("w.npy"), tools::NpyArray::of(DType::f32, c.w_shape(), in.w), false);
  const CliRun r =
      mhla_cli("backward --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
               " --grad-o " + path("g.npy") + " --w " + path("w.npy") +
               " --masking causal --block 4 --toeplitz-length 2 --out-dir " + path("out"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
             g = cast<float>(in.grad_o), w = cast<float>(in.w);
  std::vector<float> o(v.size()), gq(q.size()), gk(k.size()), gv(v.size()), gw(w.size());
  const Options opts = c.options();
  forward<float>(opts, view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(o, c.v_shape()));
  backward<float>(opts, view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                  view(w, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()),
                  view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                  view(gw, c.w_shape()));
  const std::pair<const char*, const std::vector<float>*> expected[] = {
      {"o", &o}, {"grad_q", &gq}, {"grad_k", &gk}, {"grad_v", &gv}, {"grad_w", &gw}};
  for (const auto& [name, want] : expected) {
    const tools::NpyArray got = tools::read_npy(path("out/" + std::string(name) + ".npy"));
    EXPECT_EQ(got.dtype(), DType::f32) << name;
    EXPECT_EQ(got.as<float>(), *want) << name;  // same kernel, bit-identical
  }
}

TEST_F(Cli, BadInputIsAOneLineErrorAndNothingIsOverwritten) {
  tools::write_npy(path("q.npy"),
                   tools::NpyArray::of(DType::f32, {1, 8, 1, 4}, std::vector<double>(32, 0.5)),
                   false);
  const std::string qkv =
      " --q " + path("q.npy") + " --k " + path("q.npy") + " --v " + path("q.npy");
  ASSERT_EQ(mhla_cli("forward" + qkv + " --block 4 --out-dir " + path("out")).status, 0);
  const auto before = fs::last_write_time(path("out/o.npy"));
  const CliRun again = mhla_cli("forward" + qkv + " --block 4 --out-dir " + path("out"));
  EXPECT_NE(again.status, 0);
  EXPECT_THAT(again.output,
              HasSubstr("o.npy: already exists; refusing to overwrite it (pass --force)"));
  EXPECT_EQ(fs::last_write_time(path("out/o.npy")), before);
  EXPECT_EQ(mhla_cli("forward" + qkv + " --block 4 --force --out-dir " + path("out")).status, 0);

  // A truncated file: one line naming it.
  std::ifstream full(path("q.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(full)), std::istreambuf_iterator<char>());
  std::ofstream(path("t.npy"), std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  const CliRun truncated = mhla_cli("forward --q " + path("t.npy") + " --k " + path("q.npy") +
                                    " --v " + path("q.npy") + " --out-dir " + path("out2"));
  EXPECT_NE(truncated.status, 0);
  EXPECT_THAT(truncated.output, HasSubstr("error: " + path("t.npy") + ": data holds"));
  EXPECT_EQ(std::count(truncated.output.begin(), truncated.output.end(), '\n'), 1)
      << truncated.output;
  const CliRun missing = mhla_cli("forward --q " + path("nope.npy") + " --k x --v y");
  EXPECT_NE(missing.status, 0);
  EXPECT_THAT(missing.output, HasSubstr("cannot open '" + path("nope.npy") + "'"));
  const CliRun layout = mhla_cli("forward" + qkv + " --grid 3x3 --out-dir " + path("out3"));
  EXPECT_NE(layout.status, 0);
  EXPECT_THAT(layout.output, HasSubstr("has 9 tokens but q has N = 8"));
  const CliRun flag = mhla_cli("forward" + qkv + " --masking sideways --out-dir " + path("out3"));
  EXPECT_NE(flag.status, 0);
  EXPECT_THAT(flag.output,
              HasSubstr("unknown masking 'sideways'; expected none, causal or block_causal"));
}

// Each input file reaches the library with its own shape: a k whose shape
// differs from q's is a named error (it once was read with q's shape: silent
// garbage from forward, heap corruption or a hang in backward).
TEST_F(Cli, InconsistentShapesAndBadFlagsAreNamedErrors) {
  auto save = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, double value) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    tools::write_npy(path(name),
                     tools::NpyArray::of(dtype, shape, std::vector<double>(size_t(n), value)),
                     false);
  };
  save("q.npy", DType::f32, {1, 16, 2, 4}, 0.5);
  save("k3.npy", DType::f32, {1, 16, 2, 3}, 0.5);
  save("k5.npy", DType::f32, {1, 16, 2, 5}, 0.5);
  save("k1.npy", DType::f32, {1, 1, 1, 1}, 0.5);
  save("g.npy", DType::f32, {1, 16, 2, 4}, 0.5);
  const std::string q = " --q " + path("q.npy") + " --v " + path("q.npy") + " --block 4";
  for (const char* kind : {"forward", "backward"})
    for (const auto& [file, shape] : {std::pair{"k3.npy", "[1, 16, 2, 3]"},
                                      {"k5.npy", "[1, 16, 2, 5]"},
                                      {"k1.npy", "[1, 1, 1, 1]"}}) {
      SCOPED_TRACE(std::string(kind) + " " + file);
      const std::string out = path(std::string("out-") + kind + file);
      const std::string grad = kind == std::string("backward") ? " --grad-o " + path("g.npy") : "";
      const CliRun r =
          mhla_cli(std::string(kind) + q + " --k " + path(file) + grad + " --out-dir " + out);
      EXPECT_EQ(r.status, 1) << r.output;
      EXPECT_THAT(r.output, HasSubstr(std::string("error: mhla::forward: k has shape ") + shape +
                                      ", expected [1, 16, 2, 4]"));
      EXPECT_FALSE(fs::exists(out + "/o.npy"));
    }
  const std::string qkv = q + " --k " + path("q.npy") + " --out-dir " + path("o");
  const CliRun length = mhla_cli("forward" + qkv + " --masking causal --toeplitz-length -5");
  EXPECT_NE(length.status, 0);
  EXPECT_THAT(length.output, HasSubstr("--toeplitz-length: must be an integer >= 0, got '-5'"));
  const CliRun block = mhla_cli("forward" + qkv + " --block 0");
  EXPECT_NE(block.status, 0);
  EXPECT_THAT(block.output, HasSubstr("--block: must be a positive integer, got '0'"));
  EXPECT_THAT(block.output, Not(HasSubstr("1797693")));

  // Finite float32 input whose normalized read-out overflows: named, nothing written.
  save("huge.npy", DType::f32, {1, 16, 2, 4}, 1e19);
  const CliRun overflow = mhla_cli("forward --q " + path("huge.npy") + " --k " + path("huge.npy") +
                                   " --v " + path("q.npy") + " --block 4 --out-dir " + path("o2"));
  EXPECT_EQ(overflow.status, 1);
  EXPECT_THAT(overflow.output, HasSubstr("is not finite although every input is finite"));
  EXPECT_THAT(overflow.output, HasSubstr("overflows float32"));
  EXPECT_FALSE(fs::exists(path("o2/o.npy")));
}

// OpenBLAS falls back to SSE3 kernels ("Prescott") on CPUs newer than its
// build; the program then restarts on the widest kernels the CPU runs.
TEST_F(Cli, RunsOnOpenblasKernelsForThisCpuUnlessTheUserNamesOne) {
  const CliRun named = mhla_cli("--version", "OPENBLAS_CORETYPE=Haswell");
  ASSERT_EQ(named.status, 0) << named.output;
  EXPECT_THAT(named.output, HasSubstr("Haswell kernels"));
  const CliRun chosen = mhla_cli("--version", "-u OPENBLAS_CORETYPE");
  ASSERT_EQ(chosen.status, 0) << chosen.output;
  EXPECT_THAT(chosen.output, HasSubstr("mhla "));
  if (tools::this_cpu_vector_units().avx2_fma) {
    EXPECT_THAT(chosen.output, Not(HasSubstr("Prescott kernels")));
  }
}

TEST_F(Cli, AnalyzeWritesHeatmapsAndSummary) {
  const CliRun r = mhla_cli("analyze --sample-tokens 64 --out-dir " + path("maps"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(path("maps/summary.json"));
  const nlohmann::json summary = nlohmann::json::parse(in);
  ASSERT_EQ(summary["methods"].size(), 3u);
  // Linear attention's rank is capped by the head dimension (16); MHLA's is not.
  EXPECT_LE(summary["methods"][1]["rank"].get<int64_t>(), 16);
  EXPECT_GT(summary["methods"][2]["rank"].get<int64_t>(), 16);
  for (const char* name : {"softmax.png", "linear.png", "mhla.png"}) {
    std::ifstream png(path("maps/" + std::string(name)), std::ios::binary);
    char signature[8] = {};
    png.read(signature, 8);
    EXPECT_EQ(std::string(signature + 1, 3), "PNG") << name;
  }
}

TEST_F(Cli, BenchWritesCsvJsonAndPlot) {
  const CliRun r =
      mhla_cli("bench --tokens 64,256 --dims 8 --heads 2 --repeats 1 --out-dir " + path("b"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream csv(path("b/bench.csv"));
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 1 + 2 * 3);  // header + 2 lengths x 3 methods
  std::ifstream in(path("b/bench.json"));
  const nlohmann::json summary = nlohmann::json::parse(in);
  for (const auto& row : summary["results"]) {
    EXPECT_GT(row["seconds"].get<double>(), 0.0);
    EXPECT_GT(row["peak_rss_bytes"].get<double>(), 0.0);
  }
  EXPECT_TRUE(fs::exists(path("b/bench.png")));
}

// A tiny run's flags, shared by the train and resume steps below.
const std::string kTinyTrain =
    "train --task mqar --attention mhla,softmax --dim 8 --heads 2 --mlp 8 --conv 2 --steps 6 "
    "--warmup 1 --batch 2 "
    "--vocab 16 --seq-len 16 --kv-pairs 2 --block 4 --eval-samples 4 --threads 1 ";

TEST_F(Cli, TrainStopsResumesAndWritesItsOutputs) {
  const CliRun whole = mhla_cli(kTinyTrain + "--out " + path("whole"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  EXPECT_THAT(whole.output, HasSubstr("final evaluation: validation loss"));
  for (const char* name : {"checkpoint.safetensors", "metrics.json", "loss.png"})
    EXPECT_TRUE(fs::exists(path("whole/" + std::string(name)))) << name;

  const CliRun part = mhla_cli(kTinyTrain + "--stop-after 3 --out " + path("split"));
  ASSERT_EQ(part.status, 0) << part.output;
  EXPECT_THAT(part.output, HasSubstr("stopped before the end; continue with --resume"));
  const CliRun rest = mhla_cli(kTinyTrain + "--out " + path("split") + " --resume " +
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
  const CliRun other = mhla_cli(kTinyTrain + "--seed 9 --out " + path("other") + " --resume " +
                                path("whole/checkpoint.safetensors"));
  EXPECT_EQ(other.status, 1);
  EXPECT_THAT(other.output, HasSubstr("seed 0 vs 9"));
  {
    std::ofstream damaged(path("damaged.safetensors"), std::ios::binary);
    damaged.write("\x10\0\0\0\0\0\0\0{\"a\":", 13);  // promises a 16-byte header, holds 5
  }
  const CliRun bad =
      mhla_cli(kTinyTrain + "--out " + path("bad") + " --resume " + path("damaged.safetensors"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output, HasSubstr("damaged.safetensors"));
}

TEST_F(Cli, CompareWidensTheGridAndContinuesAStoppedComparison) {
  const std::string compare =
      "compare --preset full --tasks mqar --steps 4 --eval-size 8 --seeds 0,1 --lrs 1e-3,2e-3 "
      "--threads 1 --out " +
      path("c");
  const CliRun first = mhla_cli(compare);
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
    std::snprintf(chosen, sizeof chosen, "%g", report["entries"][0]["models"][0]["lr"].get<double>());
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
  const CliRun again = mhla_cli(compare);
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
  const CliRun third = mhla_cli(compare);
  ASSERT_EQ(third.status, 0) << third.output;
  EXPECT_THAT(third.output, HasSubstr(" tok/s"));
  EXPECT_THAT(third.output, HasSubstr("seed 1: validation"));
  EXPECT_EQ(tables(), before);
}

TEST_F(Cli, CompareTakesOneModelSizeForEveryModel) {
  const std::string compare =
      "compare --preset full --tasks mqar --steps 2 --eval-size 4 --seeds 0 --lrs 1e-3 "
      "--threads 1 --layers 3 --dim 16 --heads 4 --mlp 24 --attention softmax,linear ";
  const CliRun r = mhla_cli(compare + "--out " + path("sized"));
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
  const CliRun bad = mhla_cli(
      "compare --preset full --tasks mqar --layers 3 --attention "
      "linear/mhla --out " +
      path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output, HasSubstr("--layers 3 but the model 'linear/mhla' lists 2 layers"));
}

TEST_F(Cli, CompareTrainsOnlyTheTablesNamed) {
  const std::string compare =
      "compare --preset full --tasks all --steps 2 --eval-size 4 --seeds 0 --lrs 1e-3 "
      "--threads 1 --dim 8 --heads 2 --mlp 8 ";
  const CliRun r = mhla_cli(compare + "--tables 'mqar N=256 kv=8' --out " + path("one"));
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

  const CliRun bad =
      mhla_cli(compare + "--tables 'mqar N=256,text KJV N=512' --out " + path("bad"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.output,
              HasSubstr("--tables: no table 'mqar N=256' in this comparison; its tables "
                        "are 'text KJV N=512', "));
  EXPECT_FALSE(fs::exists(path("bad/text_KJV_N_512")));
}

TEST_F(Cli, CompareMeasuresEveryModelAgainstTheBaselineTable) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's fashion-mnist package is not installed";
  const std::string compare =
      "compare --preset plateau --steps 2 --eval-size 16 --seeds 0,1 --lrs 1e-3 --threads 1 "
      "--dim 8 --heads 2 --mlp 8 --attention softmax,mhla ";
  const CliRun r = mhla_cli(
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
                  100 * (model["test"][s].get<double>() - baseline["test"][s].get<double>()),
                  1e-9);
    EXPECT_THAT(text, HasSubstr("| " + model["attention"].get<std::string>() +
                                " − fashion-mnist 1 token | "));
  }
  // Without the baseline table in the command, no such rows.
  const CliRun alone =
      mhla_cli(compare + "--tables 'fashion-mnist 196 tokens' --out " + path("b"));
  ASSERT_EQ(alone.status, 0) << alone.output;
  std::ifstream again(path("b/compare.json"));
  EXPECT_EQ(nlohmann::json::parse(again)["entries"][0]["paired_test_differences"].size(), 1u);
}

TEST_F(Cli, TrainOneKindFillsTheDepth) {
  const std::string tiny =
      "train --dim 8 --heads 2 --mlp 8 --steps 2 --warmup 0 --batch 2 --vocab 16 --seq-len 16 "
      "--kv-pairs 2 "
      "--block 4 --eval-samples 2 --attention linear ";
  auto layers = [&](const std::string& extra, const std::string& dir) {
    const CliRun r = mhla_cli(tiny + extra + "--out " + path(dir));
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(path(dir + "/metrics.json"));
    return nlohmann::json::parse(in)["config"]["attention"].get<std::string>();
  };
  EXPECT_EQ(layers("", "preset"), "linear,linear");  // the preset's two layers
  EXPECT_EQ(layers("--layers 3 ", "three"), "linear,linear,linear");
}

TEST_F(Cli, TrainRejectsBadSettings) {
  const CliRun r = mhla_cli("train --task mqar --attention mhla,bogus --out " + path("x"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("unknown attention 'bogus'"));
  const CliRun layers = mhla_cli("train --attention mhla,linear --layers 3 --out " + path("z"));
  EXPECT_EQ(layers.status, 1);
  EXPECT_THAT(layers.output, HasSubstr("--layers 3 but --attention lists 2 layers"));
  const CliRun fm = mhla_cli("train --task fashion-mnist --data " + path("none") +
                             " --steps 2 --warmup 0 --out " + path("y"));
  EXPECT_EQ(fm.status, 1);
  EXPECT_THAT(fm.output, HasSubstr("apt-get install dataset-fashion-mnist"));
}

}  // namespace
}  // namespace mhla::test
