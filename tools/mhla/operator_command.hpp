#pragma once
// `mhla forward`, `mhla backward` and `mhla analyze`: the operator on tensors
// from .npy/.npz files, every option a flag. forward/backward write .npy
// results; analyze writes the three attention matrices as PNG heatmaps and a
// JSON summary of their rank and entropy.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace mhla::tools {

struct OperatorCommand {
  enum class Kind { forward, backward, analyze } kind = Kind::forward;
  int64_t batch_index = 0, head_index = 0;  // analyze
  int64_t sample_tokens = 256;              // analyze without --q: built-in sample
  std::string q, k, v, w, grad_o, inputs, out_dir = ".";
  std::string order = "bnhd";
  std::string grid, tile;  // "14x14" / "7x7"; empty grid: 1D with `block`
  int64_t block = 64;
  std::string masking = "none", feature_map = "elu1", mixing_init = "linear";
  bool unnormalized = false, force = false;
  double eps = 1e-6, sigma = 1.0, threshold = 1.5;
  std::optional<double> scale;
  std::optional<int64_t> toeplitz_length;  // given: Toeplitz mixing with this L
};

// Registers the subcommand's flags (with --help text and examples).
CLI::App* add_operator_command(CLI::App& app, OperatorCommand& command);
int run_operator_command(const OperatorCommand& command);

}  // namespace mhla::tools
