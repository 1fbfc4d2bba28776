// The `mhla` command-line program.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "bench_command.hpp"
#include "common/openblas_core.hpp"
#include "demo.hpp"
#include "mhla/version.hpp"
#include "operator_command.hpp"

int main(int argc, char** argv) {
  mhla::tools::restart_on_known_openblas_kernels(argv);
  CLI::App app{"mhla: Multi-Head Linear Attention on CPU"};
  app.set_version_flag("--version", [] {
    return std::string("mhla ") + mhla::version + " (" + mhla::tools::openblas_description() + ")";
  });
  app.require_subcommand(1);

  mhla::tools::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo",
      "Self-check, speed table (softmax vs linear vs MHLA) and rank/entropy diagnosis "
      "on built-in synthetic data.\nExample: mhla demo --max-n 8192");
  demo_cmd->add_flag("--quick", demo.quick, "small sizes and single repeats (smoke test)");
  demo_cmd->add_option("--max-n", demo.max_tokens, "largest sequence length in the speed table")
      ->check(CLI::Range(int64_t(256), int64_t(1) << 22));

  using Kind = mhla::tools::OperatorCommand::Kind;
  mhla::tools::OperatorCommand forward_args, backward_args, analyze_args;
  backward_args.kind = Kind::backward;
  analyze_args.kind = Kind::analyze;
  CLI::App* forward_cmd = mhla::tools::add_operator_command(app, forward_args);
  CLI::App* backward_cmd = mhla::tools::add_operator_command(app, backward_args);
  CLI::App* analyze_cmd = mhla::tools::add_operator_command(app, analyze_args);

  mhla::tools::BenchCommand bench_args;
  CLI::App* bench_cmd = mhla::tools::add_bench_command(app, bench_args);

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) {
      if (demo.quick && demo_cmd->count("--max-n") == 0) demo.max_tokens = 1024;
      return mhla::tools::run_demo(demo);
    }
    if (forward_cmd->parsed()) return mhla::tools::run_operator_command(forward_args);
    if (backward_cmd->parsed()) return mhla::tools::run_operator_command(backward_args);
    if (analyze_cmd->parsed()) return mhla::tools::run_operator_command(analyze_args);
    if (bench_cmd->parsed()) return mhla::tools::run_bench_command(bench_args);
  } catch (const std::bad_alloc&) {
    // The library names its own allocations (mhla::OutOfMemory, with bytes);
    // this is the program's own copies of the input.
    std::fprintf(stderr, "error: out of memory while holding the inputs and results in memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
