#include <omp.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/cli_checks.hpp"
#include "common/json_file.hpp"
#include "mhla/error.hpp"
#include "presets.hpp"
#include "train_command.hpp"
#include "training_report.hpp"

namespace mhla::tools {
namespace {

using nlohmann::json;

// One model of the comparison: "mhla/mhla/softmax" gives one kind per layer (a
// single kind keeps the preset's depth); a suffix "@uniform" sets MHLA's
// initial mixing (a MixingTransform name) for this model only.
void apply_model(const std::string& item, train::RunConfig& config) {
  const size_t at = item.find('@');
  std::string commas = item.substr(0, at);
  for (char& ch : commas) ch = ch == '/' ? ',' : ch;
  std::vector<train::AttentionKind> kinds = train::parse_attention_list(commas);
  if (kinds.size() == 1) kinds.assign(config.attention.size(), kinds[0]);
  config.attention = kinds;
  if (at != std::string::npos) {
    config.mixing_init = item.substr(at + 1);
    parse_mixing_transform(config.mixing_init);
  }
}

std::string slug(std::string text) {
  for (char& ch : text)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') ch = '_';
  return text;
}

struct Cell {
  std::vector<double> accuracy;
  double seconds = 0;
};

}  // namespace

CLI::App* add_compare_command(CLI::App& app, CompareCommand& c) {
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Train the same small Transformer with softmax, linear attention and MHLA on MQAR and Fashion-MNIST "
      "and print the accuracy table.\nWrites OUT/compare.md, OUT/compare.json, one loss PNG per task and each "
      "run's metrics.json.\nExamples:\n  mhla compare --preset quick\n"
      "  mhla compare --preset full --tasks mqar --seeds 0,1,2 --out runs/compare-mqar\n"
      "  mhla compare --tasks fashion-mnist --attention linear,mhla,mhla/mhla/softmax");
  cmd->add_option("--preset", c.preset, "quick (a few minutes on 2 cores) or full")->check(CLI::IsMember({"quick", "full"}));
  cmd->add_option("--tasks", c.tasks, "mqar, fashion-mnist or all")->check(CLI::IsMember({"mqar", "fashion-mnist", "all"}));
  cmd->add_option("--attention", c.attention,
                  "comma list of models: a kind for every layer, or kinds per layer joined by / (mhla/mhla/softmax); "
                  "@INIT sets MHLA's initial mixing for that model (mhla@uniform)")
      ->delimiter(',');
  cmd->add_option("--seeds", c.seeds, "seeds, comma separated")->delimiter(',');
  cmd->add_option("--out", c.out_dir, "output folder");
  cmd->add_option("--data", c.data_dir, "Fashion-MNIST folder (default: the Debian package's)");
  cmd->add_option("--threads", c.threads, "OpenMP threads (default: all cores)")->check(CLI::Range(1, 1024));
  cmd->add_option("--mixing-init", c.mixing_init,
                  "MHLA's initial W in every run unless a model says @INIT (default: the preset's, linear)");
  cmd->add_option("--steps", c.steps, "train every model this many steps instead of the preset's (smoke tests)")
      ->check(positive_integer());
  return cmd;
}

int run_compare_command(const CompareCommand& c) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  const int threads = omp_get_max_threads();
  const std::vector<std::string>& models = c.attention;
  std::vector<ComparisonEntry> entries = comparison_entries(c.tasks, c.preset);
  if (c.steps > 0)
    for (ComparisonEntry& e : entries) {
      e.config.steps = c.steps;
      e.config.warmup = std::min(e.config.warmup, c.steps / 10);
    }
  if (!c.mixing_init.empty())
    for (ComparisonEntry& e : entries) e.config.mixing_init = c.mixing_init;
  if (c.seeds.empty()) throw Error("--seeds needs at least one seed");
  for (const std::string& m : models) {  // reject bad names before any training
    train::RunConfig probe;
    apply_model(m, probe);
  }
  const std::filesystem::path out(c.out_dir);
  std::filesystem::create_directories(out);
  const auto start = std::chrono::steady_clock::now();

  json report = {{"preset", c.preset}, {"threads", threads}, {"seeds", c.seeds}, {"entries", json::array()}};
  std::string table = "| task | " ;
  for (const std::string& m : models) table += m + " | ";
  table += "\n|---|";
  for (size_t i = 0; i < models.size(); ++i) table += "---:|";
  table += "\n";
  for (const ComparisonEntry& entry : entries) {
    std::printf("== %s: %lld steps of %lld per model, seeds", entry.label.c_str(), (long long)entry.config.steps,
                (long long)entry.config.batch);
    for (uint64_t s : c.seeds) std::printf(" %llu", (unsigned long long)s);
    std::printf(", %d threads\n", threads);
    std::fflush(stdout);
    std::vector<LossSeries> curves;
    json entry_json = {{"label", entry.label}, {"config", train::to_json(entry.config)}, {"models", json::array()}};
    table += "| " + entry.label + " | ";
    for (const std::string& model : models) {
      Cell cell;
      for (uint64_t seed : c.seeds) {
        train::RunConfig config = entry.config;
        config.seed = seed;
        apply_model(model, config);
        const std::filesystem::path dir = out / slug(entry.label) / (slug(model) + "-seed" + std::to_string(seed));
        std::filesystem::create_directories(dir);
        train::RunOptions options;
        options.data_dir = c.data_dir;
        const train::RunResult r = run_with_progress(config, options, entry.label + " " + model);
        write_run_metrics((dir / "metrics.json").string(), config, r, threads);
        cell.accuracy.push_back(r.final_eval.accuracy);
        cell.seconds += r.history.seconds;
        std::printf("  %-22s seed %llu: accuracy %.4f, eval loss %.4f, %.1f s, %.0f tokens/s\n", model.c_str(),
                    (unsigned long long)seed, r.final_eval.accuracy, r.final_eval.loss, r.history.seconds,
                    r.tokens_per_second);
        std::fflush(stdout);
        if (seed == c.seeds.front()) curves.push_back({model, r.history.train_loss, r.history.eval});
      }
      double mean = 0, var = 0;
      for (double a : cell.accuracy) mean += a / double(cell.accuracy.size());
      for (double a : cell.accuracy) var += (a - mean) * (a - mean) / double(std::max<size_t>(cell.accuracy.size() - 1, 1));
      char text[64];
      if (cell.accuracy.size() > 1)
        std::snprintf(text, sizeof text, "%.1f%% ± %.1f", 100 * mean, 100 * std::sqrt(var));
      else
        std::snprintf(text, sizeof text, "%.1f%%", 100 * mean);
      table += std::string(text) + " | ";
      entry_json["models"].push_back({{"attention", model}, {"accuracy", cell.accuracy}, {"mean_accuracy", mean},
                                      {"train_seconds", cell.seconds}});
    }
    table += "\n";
    const std::string png = (out / (slug(entry.label) + "-loss.png")).string();
    write_loss_png(png, entry.label + " (seed " + std::to_string(c.seeds.front()) + ")", curves);
    entry_json["loss_png"] = png;
    report["entries"].push_back(entry_json);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report["wall_seconds"] = seconds;
  const std::string caption = "Accuracy on the evaluation set (MQAR: queried positions; Fashion-MNIST: test images), " +
                              std::string(c.seeds.size() > 1 ? "mean ± std over seeds" : "one seed") + ", preset " +
                              c.preset + ", " + std::to_string(threads) + " threads, " +
                              std::to_string(int(seconds + 0.5)) + " s in all.\n\n";
  std::printf("\n%s%s", caption.c_str(), table.c_str());
  {
    std::ofstream md(out / "compare.md");
    md << caption << table;
    if (!md) throw Error((out / "compare.md").string() + ": cannot write");
  }
  if (!write_json_file((out / "compare.json").string(), report)) throw Error("cannot write compare.json");
  std::printf("wrote %s/compare.md, compare.json and the loss curves (*-loss.png)\n", c.out_dir.c_str());
  return 0;
}

}  // namespace mhla::tools
