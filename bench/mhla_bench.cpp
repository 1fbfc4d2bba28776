// The operator benchmark: one run prints the machine's SGEMM rate, MHLA's
// forward and forward+backward rates against it, time ratios against the
// linear-attention and softmax baselines, bfloat16 against float32, linear
// scaling to 1M tokens, peak memory, and the sequence length where MHLA
// overtakes softmax.
//
//   mhla_bench [--json results.json] [--quick] [--softmax-max-n N]
//
// Rates are also divided by the best SGEMM rate of the machine, measured in a
// child process with OPENBLAS_CORETYPE unset.
#include <omp.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/crossover.hpp"
#include "common/json_file.hpp"
#include "common/openblas_core.hpp"
#include "common/sgemm_rate.hpp"
#include "common/timing.hpp"
#include "common/workload.hpp"

using mhla::tools::blocks_for;
using mhla::tools::median_seconds;
using mhla::tools::peak_rss_bytes;
using mhla::tools::TimingPolicy;
using mhla::tools::Workload;
using nlohmann::json;

namespace {

constexpr int64_t kHeads = 8, kDim = 64;

int memory_probe(int64_t tokens) {
  const double before = peak_rss_bytes();
  Workload wl(1, tokens, 1, kDim, blocks_for(tokens));
  // The training path, which also holds the saved and mixed summaries (not counted in
  // tensor_bytes, so they count against the ratio).
  wl.mhla_forward_saving();
  wl.mhla_backward_saved();
  json out = {{"tokens", tokens},
              {"peak_rss_bytes", peak_rss_bytes()},
              {"rss_before_tensors_bytes", before},
              {"tensor_bytes", wl.tensor_bytes()}};
  std::cout << out.dump() << std::endl;
  return 0;
}

json run_memory_probe(int64_t tokens) {
  return json::parse(mhla::tools::run_self({"--memory-probe", std::to_string(tokens)}));
}

// The child side of the best-SGEMM measurement: the median rate of `repeats`
// square SGEMMs, printed as JSON.
int sgemm_probe(int size, int repeats) {
  mhla::tools::SgemmProbe sgemm(size);
  sgemm.run();  // warm-up: thread start, page faults
  const double t = median_seconds([&] { sgemm.run(); }, TimingPolicy{repeats, 0.0, repeats, false});
  std::cout << json{{"gflops", sgemm.flops() / t / 1e9}}.dump() << std::endl;
  return 0;
}

// OPENBLAS_CORETYPE, read when OpenBLAS loads, can pin it to an older
// instruction set than the CPU has (these machines set Haswell: AVX2). The
// best rate the machine's SGEMM reaches is measured in a child process
// started without the variable, so OpenBLAS picks kernels for the CPU (or,
// on a CPU it does not know, restart_on_known_openblas_kernels does).
double best_sgemm_gflops(int size, int repeats) {
  const json out = json::parse(mhla::tools::run_self(
      {"--sgemm-probe", std::to_string(size), "--probe-repeats", std::to_string(repeats)},
      {"OPENBLAS_CORETYPE"}));
  return out["gflops"].get<double>();
}

struct Row {
  int64_t tokens, blocks;
  double sgemm, mhla_fwd, mhla_fwdbwd, mhla_fwdbwd_saved, linear_fwd, linear_fwdbwd, softmax_fwd;
  double flops_fwd, flops_fwdbwd, sgemm_flops;
  double linear_flops_fwd, softmax_flops_fwd;  // the baselines' own FLOP formulas
};

// The SGEMM yardstick, MHLA and linear attention are timed interleaved, repeat
// after repeat, so every ratio compares runs made under the same load.
Row measure(int64_t tokens, bool with_softmax, int repeats, int sgemm_size) {
  const int64_t m = blocks_for(tokens);
  Workload wl(1, tokens, kHeads, kDim, m);
  mhla::tools::SgemmProbe sgemm(sgemm_size);
  const auto flops = mhla::mhla_flops(1, tokens, kHeads, kDim, kDim, m, mhla::Masking::none, 0);
  const std::vector<double> t =
      mhla::tools::interleaved_medians({[&] { sgemm.run(); }, [&] { wl.mhla_forward(); },
                                        [&] {
                                          wl.mhla_forward();
                                          wl.mhla_backward();
                                        },
                                        [&] {
                                          wl.mhla_forward_saving();
                                          wl.mhla_backward_saved();
                                        },
                                        [&] { wl.linear_forward(); },
                                        [&] {
                                          wl.linear_forward();
                                          wl.linear_backward();
                                        }},
                                       repeats);
  Row r{tokens,
        m,
        t[0],
        t[1],
        t[2],
        t[3],
        t[4],
        t[5],
        -1,
        flops.forward,
        flops.forward + flops.backward,
        sgemm.flops(),
        mhla::linear_attention_flops_forward(1, tokens, kHeads, kDim, kDim),
        mhla::softmax_flops_forward(1, tokens, kHeads, kDim, kDim, false)};
  if (with_softmax) {
    // Quadratic and ~100x slower than MHLA at these sizes, so load drift does
    // not matter for its ratio: one timed call at the largest sizes.
    const TimingPolicy once{1, 0.0, 1, false};
    r.softmax_fwd =
        median_seconds([&] { wl.softmax_forward(); }, tokens >= 16384 ? once : TimingPolicy{});
  }
  return r;
}

// The masked modes on the training path: forward and forward+backward with
// both summaries saved, interleaved with the SGEMM yardstick. Causal adds the
// in-block masked products, whose C x C tiles grow with the block size.
struct MaskedRow {
  double sgemm, fwd, fwdbwd_saved;
  mhla::FlopCount flops;
};

MaskedRow measure_masked(int64_t tokens, mhla::Masking masking, int repeats, int sgemm_size) {
  const int64_t m = blocks_for(tokens);
  Workload wl(1, tokens, kHeads, kDim, m, masking);
  mhla::tools::SgemmProbe sgemm(sgemm_size);
  const std::vector<double> t =
      mhla::tools::interleaved_medians({[&] { sgemm.run(); }, [&] { wl.mhla_forward(); },
                                        [&] {
                                          wl.mhla_forward_saving();
                                          wl.mhla_backward_saved();
                                        }},
                                       repeats);
  return {sgemm.flops() / t[0] / 1e9, t[1], t[2],
          mhla::mhla_flops(1, tokens, kHeads, kDim, kDim, m, masking,
                           wl.options.layout.max_block_size())};
}

// What every part of one benchmark run shares.
struct Settings {
  bool quick;
  int repeats, sgemm_size;
  int64_t softmax_max_n;
  double best_sgemm;                   // GFLOP/s, in a child process with OPENBLAS_CORETYPE unset
  int64_t small_tokens, large_tokens;  // the linear-scaling pair; the memory probe runs the large
};

// Rates at B=1, H=8, D=64, M = sqrt(N), against SGEMM and the baselines.
void rates(const Settings& s, json& results) {
  std::printf("B=1 H=8 D=64, non-causal, elu1, normalized, M = sqrt(N)\n");
  std::printf(
      "f+b recomputes the block and mixed summaries in backward (as the linear baseline\n"
      "does); f+b saved keeps both from forward (in a ForwardState),\n"
      "as the Python layers and the trainer do.\n");
  std::printf(
      "lin GF/s and soft GF/s: the baselines' forward rates by their own FLOP formulas\n"
      "(linear 4 N Dk Dv, softmax 2 N^2 (Dk + Dv) per head).\n");
  std::printf(
      "%8s %5s %7s | %8s %7s %6s %6s | %8s %7s %6s %6s | %8s %7s %6s | %7s %7s %8s | %10s %9s "
      "%9s\n",
      "N", "M", "SGEMM", "fwd ms", "GFLOP/s", "%SGEMM", "%best", "f+b ms", "GFLOP/s", "%SGEMM",
      "%best", "f+b sav", "GFLOP/s", "%SGEMM", "fwd/lin", "f+b/lin", "lin GF/s", "softmax ms",
      "fwd/soft", "soft GF/s");
  const std::vector<int64_t> sizes =
      s.quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{4096, 16384, 65536};
  for (int64_t n : sizes) {
    const Row r = measure(n, n <= s.softmax_max_n, s.repeats, s.sgemm_size);
    const double sg = r.sgemm_flops / r.sgemm / 1e9;
    const double gf = r.flops_fwd / r.mhla_fwd / 1e9, gfb = r.flops_fwdbwd / r.mhla_fwdbwd / 1e9;
    const double gfs = r.flops_fwdbwd / r.mhla_fwdbwd_saved / 1e9;
    const double best = std::max(s.best_sgemm, sg);
    std::printf(
        "%8lld %5lld %7.1f | %8.2f %7.1f %5.0f%% %5.0f%% | %8.2f %7.1f %5.0f%% %5.0f%% | %8.2f "
        "%7.1f %5.0f%% | %7.2f %7.2f %8.1f | ",
        (long long)n, (long long)r.blocks, sg, r.mhla_fwd * 1e3, gf, 100 * gf / sg, 100 * gf / best,
        r.mhla_fwdbwd * 1e3, gfb, 100 * gfb / sg, 100 * gfb / best, r.mhla_fwdbwd_saved * 1e3, gfs,
        100 * gfs / sg, r.mhla_fwd / r.linear_fwd, r.mhla_fwdbwd / r.linear_fwdbwd,
        r.linear_flops_fwd / r.linear_fwd / 1e9);
    if (r.softmax_fwd > 0)
      std::printf("%10.1f %9.4f %9.1f\n", r.softmax_fwd * 1e3, r.mhla_fwd / r.softmax_fwd,
                  r.softmax_flops_fwd / r.softmax_fwd / 1e9);
    else
      std::printf("%10s %9s %9s\n", "-", "-", "-");
    std::fflush(stdout);
    results["rates"].push_back(
        {{"tokens", n},
         {"blocks", r.blocks},
         {"sgemm_gflops", sg},
         {"mhla_forward_s", r.mhla_fwd},
         {"mhla_forward_backward_s", r.mhla_fwdbwd},
         {"mhla_forward_gflops", gf},
         {"mhla_forward_backward_gflops", gfb},
         {"mhla_forward_fraction_of_sgemm", gf / sg},
         {"mhla_forward_backward_fraction_of_sgemm", gfb / sg},
         {"mhla_forward_fraction_of_best_sgemm", gf / best},
         {"mhla_forward_backward_fraction_of_best_sgemm", gfb / best},
         {"mhla_backward_over_forward", (r.mhla_fwdbwd - r.mhla_fwd) / r.mhla_fwd},
         {"mhla_backward_saved_over_forward", (r.mhla_fwdbwd_saved - r.mhla_fwd) / r.mhla_fwd},
         {"mhla_forward_backward_saved_s", r.mhla_fwdbwd_saved},
         {"mhla_forward_backward_saved_gflops", gfs},
         {"mhla_forward_backward_saved_fraction_of_sgemm", gfs / sg},
         {"linear_forward_s", r.linear_fwd},
         {"linear_forward_backward_s", r.linear_fwdbwd},
         {"linear_forward_gflops", r.linear_flops_fwd / r.linear_fwd / 1e9},
         {"softmax_forward_gflops",
          r.softmax_fwd > 0 ? json(r.softmax_flops_fwd / r.softmax_fwd / 1e9) : json()},
         {"softmax_forward_s", r.softmax_fwd > 0 ? json(r.softmax_fwd) : json()},
         {"mhla_over_linear_forward", r.mhla_fwd / r.linear_fwd},
         {"mhla_over_linear_forward_backward", r.mhla_fwdbwd / r.linear_fwdbwd}});
  }

  for (const char* saved : {"", "_saved"}) {
    std::printf("backward%s / forward time (f+b%s minus fwd, over fwd):", saved, saved);
    for (const json& row : results["rates"])
      std::printf("  N=%lld: %.2f", (long long)row["tokens"].get<int64_t>(),
                  row[std::string("mhla_backward") + saved + "_over_forward"].get<double>());
    std::printf("\n");
  }
}

// The masked modes, on the training path.
void masked_modes(const Settings& s, json& results) {
  std::printf(
      "\nmasked modes, B=1 H=8 D=64, elu1, normalized, M = sqrt(N), block size N/M; f+b saved\n"
      "GFLOP/s by mhla_flops (causal counts half of each in-block C x C product)\n");
  std::printf("%13s %8s %5s %7s | %8s %7s %6s | %8s %7s %6s | %7s\n", "masking", "N", "M", "SGEMM",
              "fwd ms", "GFLOP/s", "%best", "f+b sav", "GFLOP/s", "%best", "bwd/fwd");
  for (const auto& [masking, name] : {std::pair{mhla::Masking::causal, "causal"},
                                      std::pair{mhla::Masking::block_causal, "block_causal"}})
    for (int64_t n : s.quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{16384, 65536}) {
      const MaskedRow r = measure_masked(n, masking, s.repeats, s.sgemm_size);
      const double best = std::max(s.best_sgemm, r.sgemm);
      const double gf = r.flops.forward / r.fwd / 1e9;
      const double gfb = (r.flops.forward + r.flops.backward) / r.fwdbwd_saved / 1e9;
      const double ratio = (r.fwdbwd_saved - r.fwd) / r.fwd;
      std::printf("%13s %8lld %5lld %7.1f | %8.2f %7.1f %5.0f%% | %8.2f %7.1f %5.0f%% | %7.2f\n",
                  name, (long long)n, (long long)blocks_for(n), r.sgemm, r.fwd * 1e3, gf,
                  100 * gf / best, r.fwdbwd_saved * 1e3, gfb, 100 * gfb / best, ratio);
      std::fflush(stdout);
      results["masked"].push_back(
          {{"masking", name},
           {"tokens", n},
           {"blocks", blocks_for(n)},
           {"sgemm_gflops", r.sgemm},
           {"mhla_forward_s", r.fwd},
           {"mhla_forward_backward_saved_s", r.fwdbwd_saved},
           {"mhla_forward_gflops", gf},
           {"mhla_forward_backward_saved_gflops", gfb},
           {"mhla_forward_fraction_of_best_sgemm", gf / best},
           {"mhla_forward_backward_saved_fraction_of_best_sgemm", gfb / best},
           {"mhla_backward_saved_over_forward", ratio}});
    }
}

// bfloat16 against float32, forward (nothing kept) and forward+backward on the
// training path, timed interleaved.
void bfloat16_against_float32(const Settings& s, json& results) {
  std::printf(
      "\nbfloat16 q, k, v, o and gradients (float32 w and saved arrays) against float32,\n"
      "B=1 H=8 D=64, non-causal, elu1, M = sqrt(N); products on bfloat16 operands: %s\n",
      mhla::bf16_products() ? "yes (AVX512-BF16)" : "no (float32 on widened copies)");
  std::printf("%8s | %8s %8s %7s | %8s %8s %7s\n", "N", "fp32 fwd", "bf16 fwd", "ratio", "fp32 f+b",
              "bf16 f+b", "ratio");
  for (int64_t n : s.quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{16384, 65536}) {
    Workload wl(1, n, kHeads, kDim, blocks_for(n));
    const auto t =
        mhla::tools::interleaved_medians({[&] { wl.mhla_forward(); }, [&] { wl.bf16_forward(); },
                                          [&] {
                                            wl.mhla_forward_saving();
                                            wl.mhla_backward_saved();
                                          },
                                          [&] {
                                            wl.bf16_forward_saving();
                                            wl.bf16_backward_saved();
                                          }},
                                         s.repeats);
    std::printf("%8lld | %8.2f %8.2f %6.2fx | %8.2f %8.2f %6.2fx\n", (long long)n, t[0] * 1e3,
                t[1] * 1e3, t[0] / t[1], t[2] * 1e3, t[3] * 1e3, t[2] / t[3]);
    std::fflush(stdout);
    results["bfloat16"].push_back({{"tokens", n},
                                   {"float32_forward_s", t[0]},
                                   {"bfloat16_forward_s", t[1]},
                                   {"float32_over_bfloat16_forward", t[0] / t[1]},
                                   {"float32_forward_backward_saved_s", t[2]},
                                   {"bfloat16_forward_backward_saved_s", t[3]},
                                   {"float32_over_bfloat16_forward_backward", t[2] / t[3]}});
  }
}

// Linear scaling: time per token at N = 16384 and N = 1,048,576 with the same
// M^2 / N = 1 (B = H = 1, D = 64).
void linear_scaling(const Settings& s, json& results) {
  const int64_t small = s.small_tokens, large = s.large_tokens;
  std::printf("\nlinear scaling, B=1 H=1 D=64, M = sqrt(N)\n");
  double per_token[2][2];
  {
    Workload ws(1, small, 1, kDim, blocks_for(small)), wl(1, large, 1, kDim, blocks_for(large));
    const auto t =
        mhla::tools::interleaved_medians({[&] { ws.mhla_forward(); }, [&] { wl.mhla_forward(); },
                                          [&] {
                                            ws.mhla_forward_saving();
                                            ws.mhla_backward_saved();
                                          },
                                          [&] {
                                            wl.mhla_forward_saving();
                                            wl.mhla_backward_saved();
                                          }},
                                         std::max(s.repeats, 3));
    per_token[0][0] = t[0] / double(small);
    per_token[1][0] = t[1] / double(large);
    per_token[0][1] = t[2] / double(small);
    per_token[1][1] = t[3] / double(large);
  }
  for (int idx = 0; idx < 2; ++idx) {
    const int64_t n = idx == 0 ? small : large;
    std::printf("  N=%8lld M=%5lld: fwd %.1f ns/token, fwd+bwd %.1f ns/token\n", (long long)n,
                (long long)blocks_for(n), per_token[idx][0] * 1e9, per_token[idx][1] * 1e9);
  }
  std::printf("  per-token time ratio N=%lld / N=%lld: fwd %.2f, fwd+bwd %.2f\n", (long long)large,
              (long long)small, per_token[1][0] / per_token[0][0],
              per_token[1][1] / per_token[0][1]);
  results["scaling"] = {
      {"small_tokens", small},
      {"large_tokens", large},
      {"forward_ns_per_token", {per_token[0][0] * 1e9, per_token[1][0] * 1e9}},
      {"forward_backward_ns_per_token", {per_token[0][1] * 1e9, per_token[1][1] * 1e9}},
      {"forward_ratio", per_token[1][0] / per_token[0][0]},
      {"forward_backward_ratio", per_token[1][1] / per_token[0][1]}};
}

// Peak memory of one forward+backward at the large N of the scaling, in a fresh
// process.
void peak_memory(const Settings& s, json& results) {
  const int64_t large = s.large_tokens;
  const json mem = run_memory_probe(large);
  const double peak = mem["peak_rss_bytes"], tensors = mem["tensor_bytes"],
               before = mem["rss_before_tensors_bytes"];
  std::printf(
      "\npeak memory, fwd+bwd at N=%lld (B=1 H=1 D=64): peak RSS %.0f MiB, tensors "
      "(q,k,v,o,grad_o,grad_q,grad_k,grad_v,w,grad_w) %.0f MiB, ratio %.3f "
      "(process before tensors: %.0f MiB)\n",
      (long long)large, peak / 1048576, tensors / 1048576, peak / tensors, before / 1048576);
  results["memory"] = mem;
  results["memory"]["peak_over_tensor_bytes"] = peak / tensors;
}

// Crossover: the N (doubling) from which MHLA's forward beats softmax's at every
// measured N; the sweep ends after three such doublings in a row.
void crossover(const Settings& s, json& results) {
  std::printf("\ncrossover, B=1 H=8 D=64, forward:\n");
  std::vector<mhla::tools::SweepPoint> points;
  int faster_in_a_row = 0;
  for (int64_t n = 128; n <= (s.quick ? 2048 : 16384); n *= 2) {
    Workload wl(1, n, kHeads, kDim, blocks_for(n));
    const auto t = mhla::tools::interleaved_medians(
        {[&] { wl.mhla_forward(); }, [&] { wl.softmax_forward(); }}, std::max(s.repeats, 3));
    const double tm = t[0], ts = t[1];
    std::printf("  N=%6lld: MHLA %8.3f ms, softmax %8.3f ms%s\n", (long long)n, tm * 1e3, ts * 1e3,
                tm < ts ? "  <- MHLA faster" : "");
    results["crossover_sweep"].push_back(
        {{"tokens", n}, {"mhla_forward_s", tm}, {"softmax_forward_s", ts}});
    points.push_back({n, tm, ts});
    faster_in_a_row = tm < ts ? faster_in_a_row + 1 : 0;
    if (faster_in_a_row == 3) break;
  }
  const int64_t crossover = mhla::tools::faster_from(points);
  results["crossover_tokens"] = crossover;
  if (crossover > 0)
    std::printf("MHLA forward is faster than softmax at every measured N from %lld to %lld\n",
                (long long)crossover, (long long)points.back().tokens);
  else
    std::printf("MHLA forward is not faster than softmax at N = %lld, the largest measured\n",
                (long long)points.back().tokens);
}

}  // namespace

int main(int argc, char** argv) {
  mhla::tools::restart_on_known_openblas_kernels(argv);
  CLI::App app{"MHLA operator benchmark (CPU, fp32)"};
  std::string json_path;
  bool quick = false;
  int64_t softmax_max_n = 65536;
  int64_t probe_tokens = 0;
  int sgemm_probe_size = 0, probe_repeats = 7;
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  app.add_flag("--quick", quick,
               "smaller sizes and fewer repeats (a smoke test, not a measurement)");
  app.add_option("--softmax-max-n", softmax_max_n,
                 "largest N at which softmax is timed (it is quadratic)")
      ->check(CLI::PositiveNumber);
  app.add_option("--memory-probe", probe_tokens, "internal: run one fwd+bwd and print peak RSS")
      ->group("");
  app.add_option("--sgemm-probe", sgemm_probe_size, "internal: time one SGEMM size, print JSON")
      ->group("");
  app.add_option("--probe-repeats", probe_repeats, "internal: repeats of --sgemm-probe")->group("");
  CLI11_PARSE(app, argc, argv);
  if (probe_tokens > 0) return memory_probe(probe_tokens);
  if (sgemm_probe_size > 0) return sgemm_probe(sgemm_probe_size, probe_repeats);

  const int repeats = quick ? 1 : 7;
  const int sgemm_size = quick ? 512 : 2048;
  json results;
  results["threads"] = omp_get_max_threads();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const double best_sgemm = best_sgemm_gflops(sgemm_size, repeats);
  results["kernel_isa"] = mhla::kernel_isa();
  results["openblas_coretype"] = coretype ? json(coretype) : json();
  results["best_sgemm_gflops"] = best_sgemm;
  std::printf(
      "threads: %d (OMP_NUM_THREADS); float kernels: %s (chosen at run time)\n"
      "SGEMM yardstick: square %d, all threads, timed interleaved with MHLA and linear\n"
      "attention (medians of %d rounds), with OPENBLAS_CORETYPE=%s as set for this process.\n"
      "best SGEMM: the same in a child process with OPENBLAS_CORETYPE unset: %.1f GFLOP/s;\n"
      "%%best divides by the larger of the two.\n\n",
      omp_get_max_threads(), mhla::kernel_isa().c_str(), sgemm_size, repeats,
      coretype ? coretype : "(unset)", best_sgemm);

  const Settings settings{quick,
                          repeats,
                          sgemm_size,
                          softmax_max_n,
                          best_sgemm,
                          quick ? 4096 : 16384,
                          quick ? 65536 : 1048576};
  rates(settings, results);
  masked_modes(settings, results);
  bfloat16_against_float32(settings, results);
  linear_scaling(settings, results);
  peak_memory(settings, results);
  crossover(settings, results);

  if (!json_path.empty()) {
    if (!mhla::tools::write_json_file(json_path, results)) return 1;
    std::printf("results written to %s\n", json_path.c_str());
  }
  return 0;
}
