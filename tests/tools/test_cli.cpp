// The `mhla` program end to end: forward/backward on .npy files written here
// agree with the library, analyze and bench write their files, and bad input
// fails with a one-line error naming the file, overwriting nothing.
#include <cblas.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/npy.hpp"
#include "common/openblas_core.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using testing::Not;
using tools::DType;

using CliRun = tools::CommandRun;

// `environment`: `env` arguments the program runs under ("-u NAME", "NAME=VALUE").
// By default it runs on this process's OpenBLAS kernels, which it would
// otherwise replace on a CPU OpenBLAS does not know, so that its results
// and the library's here agree to the bit.
CliRun mhla_cli(const std::string& args, const std::string& environment = "") {
  const std::string pinned = std::string("OPENBLAS_CORETYPE=") + openblas_get_corename();
  return tools::run_command("env " + (environment.empty() ? pinned : environment) + " " + MHLA_CLI +
                            " " + args);
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

}  // namespace
}  // namespace mhla::test
