// The `mhla` command-line program.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "demo.hpp"

int main(int argc, char** argv) {
  CLI::App app{"mhla: Multi-Head Linear Attention on CPU"};
  app.set_version_flag("--version", "mhla 0.1.0");
  app.require_subcommand(1);

  mhla::tools::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Self-check, speed table (softmax vs linear vs MHLA) and rank/entropy diagnosis "
              "on built-in synthetic data.\nExample: mhla demo --max-n 8192");
  demo_cmd->add_flag("--quick", demo.quick, "small sizes and single repeats (smoke test)");
  demo_cmd->add_option("--max-n", demo.max_tokens, "largest sequence length in the speed table")
      ->check(CLI::Range(int64_t(256), int64_t(1) << 22));

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) {
      if (demo.quick && demo_cmd->count("--max-n") == 0) demo.max_tokens = 1024;
      return mhla::tools::run_demo(demo);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
