#pragma once
// `mhla bench`: forward time and peak memory of softmax, linear attention and
// MHLA over ranges of N, D and thread counts; CSV, JSON and a log-log PNG plot
// (gnuplot) with the softmax/MHLA crossover marked.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace mhla::tools {

struct BenchCommand {
  std::vector<int64_t> tokens = {1024, 4096, 16384, 65536};
  std::vector<int64_t> dims = {64};
  std::vector<int> threads;       // default: the current OpenMP maximum
  int64_t heads = 8, blocks = 0;  // blocks 0: M = round(sqrt(N))
  int64_t softmax_max_tokens = 16384;
  int repeats = 5;
  bool memory = true, force = false;
  std::string out_dir = ".";
  // Internal: the child process of one memory measurement.
  std::vector<std::string> memory_probe;
};

CLI::App* add_bench_command(CLI::App& app, BenchCommand& command);
int run_bench_command(const BenchCommand& command);

}  // namespace mhla::tools
