#include "train_command.hpp"

#include <omp.h>

#include <cstdio>
#include <filesystem>

#include "common/cli_checks.hpp"
#include "design_flags.hpp"
#include "mhla/error.hpp"
#include "presets.hpp"
#include "training_report.hpp"

namespace mhla::tools {
namespace {

using train::RunConfig;

// A flag that overrides one RunConfig field of the preset when given.
template <typename T>
struct Flag {
  const char* flag;
  T RunConfig::*field;
  const char* help;
};
const Flag<int64_t> kIntFlags[] = {
    {"--dim", &RunConfig::dim, "model width"},
    {"--heads", &RunConfig::heads, "attention heads"},
    {"--mlp", &RunConfig::mlp_hidden, "MLP hidden width"},
    {"--conv", &RunConfig::conv_kernel,
     "short causal convolution before attention (0: none; mqar only)"},
    {"--steps", &RunConfig::steps, "optimiser steps"},
    {"--batch", &RunConfig::batch, "samples per step"},
    {"--warmup", &RunConfig::warmup, "linear warm-up steps"},
    {"--vocab", &RunConfig::vocab, "mqar: vocabulary size"},
    {"--seq-len", &RunConfig::seq_len,
     "mqar, text: tokens per sequence (text: the context in bytes)"},
    {"--kv-pairs", &RunConfig::kv_pairs, "mqar: key-value pairs per sequence"},
    {"--block", &RunConfig::block,
     "mqar, text: MHLA block length in tokens (0: M = round(sqrt(N)) blocks)"},
    {"--eval-samples", &RunConfig::eval_samples, "mqar, text: sequences per evaluation split"},
    {"--patch", &RunConfig::patch, "fashion-mnist: patch side in pixels"},
    {"--tile", &RunConfig::tile, "fashion-mnist: MHLA tile side in tokens"},
    {"--train-images", &RunConfig::train_images,
     "fashion-mnist: training images used (0: all 55000)"},
    {"--eval-images", &RunConfig::eval_images,
     "fashion-mnist: images per evaluation split (0: 5000 validation, 10000 test)"},
    {"--eval-every", &RunConfig::eval_every,
     "evaluate on the validation split every N steps (0: at the end only)"},
    {"--patience", &RunConfig::patience,
     "early stopping: stop after N evaluations without a better validation score, and report "
     "the model of the best one (0: off; needs --eval-every)"},
};
const Flag<double> kRealFlags[] = {
    {"--lr", &RunConfig::lr, "peak learning rate"},
    {"--min-lr-ratio", &RunConfig::min_lr_ratio, "final learning rate / peak"},
    {"--weight-decay", &RunConfig::weight_decay, "AdamW weight decay (matrices only)"},
    {"--clip", &RunConfig::clip, "global gradient-norm clip (0: off)"},
};
const Flag<uint64_t> kSeedFlag{"--seed", &RunConfig::seed,
                               "seed of the weights and the data order"};

// Calls fn on every override flag, whatever its field's type.
template <typename Fn>
void for_each_flag(Fn&& fn) {
  for (const auto& f : kIntFlags) fn(f);
  for (const auto& f : kRealFlags) fn(f);
  fn(kSeedFlag);
}

int set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
  return omp_get_max_threads();
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainCommand& c) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a small Transformer in C++ (MQAR recall, Fashion-MNIST or byte-level text) with "
      "softmax, linear or "
      "MHLA attention per layer.\nWrites OUT/checkpoint.safetensors, OUT/metrics.json and "
      "OUT/loss.png.\n"
      "Examples:\n  mhla-lab train --task mqar --attention mhla --layers 2 --kv-pairs 16 --out "
      "runs/mqar-mhla\n"
      "  mhla-lab train --task fashion-mnist --attention mhla,mhla,softmax --out runs/vit-hybrid\n"
      "  mhla-lab train --task text --attention mhla --gated-head on --out runs/kjv-mhla\n"
      "  mhla-lab train --task mqar --out runs/mqar-mhla --resume "
      "runs/mqar-mhla/checkpoint.safetensors");
  c.app = cmd;
  cmd->add_option("--task", c.task, "mqar, fashion-mnist or text")
      ->check(CLI::IsMember({"mqar", "fashion-mnist", "text"}));
  cmd->add_option("--preset", c.preset,
                  "starting settings: full (default), quick or plateau (fashion-mnist at 196 "
                  "tokens, every image, early stopping)")
      ->check(CLI::IsMember({"quick", "full", "plateau"}));
  cmd->add_option(
      "--attention", c.attention,
      "softmax, linear or mhla: one for every layer, or a comma list with one per layer "
      "(e.g. mhla,mhla,softmax)");
  cmd->add_option("--layers", c.layers,
                  "layers (default: the preset's 2); one --attention kind fills them all")
      ->check(CLI::Range(1, 64));
  for_each_flag([&](const auto& f) { cmd->add_option(f.flag, c.overrides.*f.field, f.help); });
  add_design_flags(*cmd, c.design);
  cmd->add_option("--out", c.out_dir, "output folder");
  cmd->add_option("--resume", c.resume,
                  "continue the run saved in this checkpoint (same settings)");
  cmd->add_option(
      "--data", c.data_dir,
      "fashion-mnist: the images' folder; text: a file with the text as 'bible' prints it "
      "(default: the Debian packages')");
  cmd->add_option("--checkpoint-every", c.checkpoint_every,
                  "checkpoint every N steps (0: at the end only)")
      ->check(non_negative_integer());
  cmd->add_option("--stop-after", c.stop_after,
                  "stop after N steps done (resume later with --resume)")
      ->check(non_negative_integer());
  cmd->add_option("--threads", c.threads, "OpenMP threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  return cmd;
}

int run_train_command(const TrainCommand& c) {
  RunConfig config = preset_config(train::parse_task(c.task), c.preset);
  for_each_flag([&](const auto& f) {
    if (c.app->count(f.flag)) config.*f.field = c.overrides.*f.field;
  });
  apply_design_flags(*c.app, c.design, config.design);
  // One kind fills the preset's depth (or --layers); a list gives one kind per layer.
  const size_t depth = c.layers > 0 ? size_t(c.layers) : config.attention.size();
  if (!c.attention.empty()) config.attention = train::parse_attention_list(c.attention);
  if (config.attention.size() == 1)
    config.attention.assign(depth, config.attention[0]);
  else if (c.layers > 0 && size_t(c.layers) != config.attention.size())
    throw Error("--layers " + std::to_string(c.layers) + " but --attention lists " +
                std::to_string(config.attention.size()) + " layers");
  train::check_run_config(config);
  const int threads = set_threads(c.threads);

  std::filesystem::create_directories(c.out_dir);
  train::RunOptions options;
  options.data_dir = c.data_dir;
  options.checkpoint = (std::filesystem::path(c.out_dir) / "checkpoint.safetensors").string();
  options.resume = c.resume;
  options.checkpoint_every = c.checkpoint_every;
  options.stop_after = c.stop_after;
  const std::string name =
      std::string(to_string(config.task)) + " " + train::attention_list_name(config.attention);
  std::printf("training %s: %lld steps of %lld, seed %llu, %d threads\n", name.c_str(),
              (long long)config.steps, (long long)config.batch, (unsigned long long)config.seed,
              threads);
  std::fflush(stdout);
  const train::RunResult r = run_with_progress(config, options, name);

  const std::filesystem::path dir(c.out_dir);
  write_run_metrics((dir / "metrics.json").string(), config, r, threads);
  write_loss_png(
      (dir / "loss.png").string(), name,
      {{train::attention_list_name(config.attention), smoothed_train_loss(r.history.train_loss),
        r.history.eval}});
  std::printf("%lld parameters, %lld/%lld steps in %.1f s of training (%.0f tokens/s)\n",
              (long long)r.parameters, (long long)r.steps_done, (long long)config.steps,
              r.history.seconds, r.tokens_per_second);
  if (r.stopped_early)
    std::printf("early stopping after step %lld: the model of step %lld, the best validation\n",
                (long long)r.steps_done, (long long)r.final_eval.step);
  if (r.finished)
    std::printf(
        "final evaluation: validation loss %.4f, accuracy %.4f; test loss %.4f, accuracy %.4f\n",
        r.final_eval.loss, r.final_eval.accuracy, r.final_test.loss, r.final_test.accuracy);
  else
    std::printf("stopped before the end; continue with --resume %s\n", options.checkpoint.c_str());
  std::printf("wrote %s, %s, %s\n", options.checkpoint.c_str(),
              (dir / "metrics.json").string().c_str(), (dir / "loss.png").string().c_str());
  return 0;
}

}  // namespace mhla::tools
