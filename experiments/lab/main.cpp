// The `mhla-lab` program: training runs and comparisons of the attentions
// (softmax, linear attention, MHLA) with the trainer in experiments/train/.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "common/openblas_core.hpp"
#include "mhla/version.hpp"
#include "train_command.hpp"

int main(int argc, char** argv) {
  mhla::tools::restart_on_known_openblas_kernels(argv);
  CLI::App app{"mhla-lab: trains small Transformers with softmax, linear attention and MHLA"};
  app.set_version_flag("--version", [] {
    return std::string("mhla-lab, library ") + mhla::version + " (" +
           mhla::tools::openblas_description() + ")";
  });
  app.require_subcommand(1);

  mhla::tools::TrainCommand train_args;
  CLI::App* train_cmd = mhla::tools::add_train_command(app, train_args);
  mhla::tools::CompareCommand compare_args;
  CLI::App* compare_cmd = mhla::tools::add_compare_command(app, compare_args);

  CLI11_PARSE(app, argc, argv);
  try {
    if (train_cmd->parsed()) return mhla::tools::run_train_command(train_args);
    if (compare_cmd->parsed()) return mhla::tools::run_compare_command(compare_args);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
