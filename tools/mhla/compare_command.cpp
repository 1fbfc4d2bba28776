#include <omp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "common/cli_checks.hpp"
#include "common/heatmap.hpp"
#include "common/json_file.hpp"
#include "mhla/analysis.hpp"
#include "mhla/error.hpp"
#include "presets.hpp"
#include "train_command.hpp"
#include "training_report.hpp"

namespace mhla::tools {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

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
  if (at != std::string::npos)
    config.design.mixing_init = parse_mixing_transform(item.substr(at + 1));
}

std::string slug(std::string text) {
  for (char& ch : text)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  return text;
}

// The number a task is judged by: bits per byte for text (lower is better),
// accuracy elsewhere (higher is better).
struct Metric {
  bool bits_per_byte = false;
  double of(const train::EvalPoint& e) const {
    return bits_per_byte ? e.loss / std::numbers::ln2 : e.accuracy;
  }
  bool better(double a, double b) const { return bits_per_byte ? a < b : a > b; }
  std::string name() const { return bits_per_byte ? "bits per byte" : "accuracy"; }
  std::string format(double v) const {
    char text[32];
    std::snprintf(text, sizeof text, bits_per_byte ? "%.3f" : "%.1f%%",
                  bits_per_byte ? v : 100 * v);
    return text;
  }
};

std::string mean_std(const Metric& metric, const std::vector<double>& values) {
  double mean = 0, var = 0;
  for (double a : values) mean += a / double(values.size());
  for (double a : values)
    var += (a - mean) * (a - mean) / double(std::max<size_t>(values.size() - 1, 1));
  std::string text = metric.format(mean);
  if (values.size() > 1) {
    const std::string sd = metric.format(std::sqrt(var));
    text += " ± " + (metric.bits_per_byte ? sd : sd.substr(0, sd.size() - 1));
  }
  return text;
}

// The paper's diagnosis on the trained model: numerical rank and mean row
// entropy of every head's attention matrix on the first held-out (validation)
// sample, and each MHLA layer's W as a heatmap PNG in `dir`.
json diagnose(train::Model<float>& model, const train::Task& task, const fs::path& dir) {
  const train::Batch& batch = task.validation_batches().front();
  model.forward(batch.input(), batch.size);
  json layers = json::array();
  const auto& blocks = model.blocks();
  for (size_t l = 0; l < blocks.size(); ++l) {
    const train::AttentionLayer<float>& a = blocks[l]->attention;
    const int64_t n = a.config.layout.num_tokens();
    json layer = {{"layer", l},
                  {"attention", train::to_string(a.config.kind)},
                  {"rank", json::array()},
                  {"row_entropy", json::array()}};
    for (int64_t h = 0; h < a.config.heads; ++h) {
      const std::vector<double> matrix = a.attention_matrix(0, h);
      layer["rank"].push_back(numerical_rank(matrix, n, n));
      layer["row_entropy"].push_back(mean_row_entropy(matrix, n, n));
    }
    if (a.config.kind == train::AttentionKind::mhla) {
      const int64_t m = a.config.layout.num_blocks();
      const std::vector<float> w = a.mixing();
      for (int64_t h = 0; h < a.mixing_heads(); ++h) {
        const std::string png =
            (dir / ("W-layer" + std::to_string(l) + "-head" + std::to_string(h) + ".png")).string();
        write_heatmap_png(png,
                          std::vector<double>(w.begin() + h * m * m, w.begin() + (h + 1) * m * m),
                          m, m, true);
        layer["mixing_png"].push_back(png);
      }
    }
    layers.push_back(layer);
  }
  return layers;
}

struct ModelRuns {
  double lr = 0;
  std::vector<double> validation, test;  // one per seed
  std::vector<json> sweep;               // the first seed at each learning rate
  LossSeries curve;                      // the first seed's run at the chosen rate
  json diagnostics;
  double seconds = 0;
};

}  // namespace

CLI::App* add_compare_command(CLI::App& app, CompareCommand& c) {
  CLI::App* cmd = app.add_subcommand("compare",
                                     "Train the same small Transformer with softmax, linear "
                                     "attention and MHLA on byte-level text (KJV), "
                                     "784-token Fashion-MNIST and MQAR; with several learning "
                                     "rates, the first seed picks each model's rate on "
                                     "the validation split.\nWrites OUT/compare.md, "
                                     "OUT/compare.json, one loss PNG per task and, per run, "
                                     "metrics.json, diagnostics and MHLA's W as "
                                     "heatmaps.\nExamples:\n  mhla compare --preset quick\n"
                                     "  mhla compare --preset full --out runs/compare-full\n"
                                     "  mhla compare --tasks fashion-mnist --attention "
                                     "linear,mhla,mhla/mhla/softmax --seeds 0,1,2");
  c.app = cmd;
  cmd->add_option("--preset", c.preset,
                  "quick (a few minutes on 2 cores) or full (about 90 minutes)")
      ->check(CLI::IsMember({"quick", "full"}));
  cmd->add_option("--tasks", c.tasks, "text, fashion-mnist, mqar or all")
      ->check(CLI::IsMember({"text", "fashion-mnist", "mqar", "all"}));
  cmd->add_option(
         "--attention", c.attention,
         "comma list of models instead of the preset's: a kind for every layer, or kinds per layer "
         "joined "
         "by / (mhla/mhla/softmax); @INIT sets MHLA's initial mixing for that model (mhla@uniform)")
      ->delimiter(',');
  cmd->add_option("--seeds", c.seeds,
                  "seeds, comma separated (default: the preset's: quick 0, full 0,1,2)")
      ->delimiter(',');
  cmd->add_option("--lrs", c.learning_rates,
                  "peak learning rates to choose from on the validation split "
                  "(default: the preset's)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--out", c.out_dir, "output folder");
  cmd->add_option("--data", c.data_dir, "Fashion-MNIST folder (default: the Debian package's)");
  cmd->add_option("--threads", c.threads, "OpenMP threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--steps", c.steps,
                  "train every model this many steps instead of the preset's (smoke tests)")
      ->check(positive_integer());
  cmd->add_option("--eval-size", c.eval_size,
                  "sequences (text, mqar) or images (fashion-mnist) per evaluation split instead "
                  "of the preset's")
      ->check(positive_integer());
  add_design_flags(*cmd, c.design);
  return cmd;
}

int run_compare_command(const CompareCommand& c) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  const int threads = omp_get_max_threads();
  std::vector<ComparisonEntry> entries = comparison_entries(c.tasks, c.preset);
  const std::vector<uint64_t> seeds = !c.seeds.empty()     ? c.seeds
                                      : c.preset == "full" ? std::vector<uint64_t>{0, 1, 2}
                                                           : std::vector<uint64_t>{0};
  for (ComparisonEntry& e : entries) {
    if (c.steps > 0) {
      e.config.steps = c.steps;
      e.config.warmup = std::min(e.config.warmup, c.steps / 10);
    }
    if (c.eval_size > 0) e.config.eval_samples = e.config.eval_images = c.eval_size;
    apply_design_flags(*c.app, c.design, e.config.design);
    if (!c.attention.empty()) e.models = c.attention;
    if (!c.learning_rates.empty()) e.learning_rates = c.learning_rates;
    for (const std::string& m : e.models) {  // reject bad names and settings before any training
      train::RunConfig probe = e.config;
      apply_model(m, probe);
      train::check_run_config(probe);
    }
  }
  const fs::path out(c.out_dir);
  fs::create_directories(out);
  const auto start = std::chrono::steady_clock::now();

  json report = {
      {"preset", c.preset}, {"threads", threads}, {"seeds", seeds}, {"entries", json::array()}};
  std::string table, diagnostics_table;
  for (const ComparisonEntry& entry : entries) {
    const Metric metric{entry.config.task == train::TaskKind::text};
    std::printf("== %s: %lld steps of %lld per run, %zu learning rate(s), seeds",
                entry.label.c_str(), (long long)entry.config.steps, (long long)entry.config.batch,
                entry.learning_rates.size());
    for (uint64_t s : seeds) std::printf(" %llu", (unsigned long long)s);
    std::printf(", %d threads\n", threads);
    std::fflush(stdout);
    json entry_json = {{"label", entry.label},
                       {"config", train::to_json(entry.config)},
                       {"metric", metric.name()},
                       {"models", json::array()}};
    std::vector<LossSeries> curves;
    table += "\n**" + entry.label + "**: test " + metric.name() + ", mean ± std over " +
             std::to_string(seeds.size()) +
             " seed(s) (learning rate chosen on validation)\n\n| model | test | validation | lr | "
             "train s |\n"
             "|---|---:|---:|---:|---:|\n";
    for (const std::string& model : entry.models) {
      ModelRuns runs;
      auto train_one = [&](uint64_t seed, double lr, bool first_seed) {
        train::RunConfig config = entry.config;
        config.seed = seed;
        config.lr = lr;
        apply_model(model, config);
        char lr_text[32];
        std::snprintf(lr_text, sizeof lr_text, "%g", lr);
        const fs::path dir = out / slug(entry.label) /
                             (slug(model) + "-lr" + lr_text + "-seed" + std::to_string(seed));
        fs::create_directories(dir);
        train::RunOptions options;
        options.data_dir = config.task == train::TaskKind::fashion_mnist ? c.data_dir : "";
        options.eval_every = std::max<int64_t>(1, config.steps / 8);
        json diagnostics;
        if (first_seed)
          options.on_finish = [&](train::Model<float>& m, const train::Task& task) {
            diagnostics = diagnose(m, task, dir);
          };
        const train::RunResult r = run_with_progress(config, options, entry.label + " " + model);
        write_run_metrics((dir / "metrics.json").string(), config, r, threads);
        if (first_seed && !write_json_file((dir / "diagnostics.json").string(), diagnostics))
          throw Error((dir / "diagnostics.json").string() + ": cannot write");
        runs.seconds += r.history.seconds;
        std::printf("  %-14s lr %-7s seed %llu: validation %s, test %s, %.1f s, %.0f tokens/s\n",
                    model.c_str(), lr_text, (unsigned long long)seed,
                    metric.format(metric.of(r.final_eval)).c_str(),
                    metric.format(metric.of(r.final_test)).c_str(), r.history.seconds,
                    r.tokens_per_second);
        std::fflush(stdout);
        return std::tuple{r, diagnostics};
      };
      // The first seed at every rate; the best validation score picks the rate.
      double best = 0;
      for (double lr : entry.learning_rates) {
        auto [r, diagnostics] = train_one(seeds.front(), lr, true);
        const double score = metric.of(r.final_eval);
        runs.sweep.push_back(
            {{"lr", lr}, {"validation", score}, {"test", metric.of(r.final_test)}});
        if (runs.validation.empty() || metric.better(score, best)) {
          best = score;
          runs.lr = lr;
          runs.validation = {score};
          runs.test = {metric.of(r.final_test)};
          runs.curve = {model, r.history.train_loss, r.history.eval};
          runs.diagnostics = diagnostics;
        }
      }
      for (size_t s = 1; s < seeds.size(); ++s) {
        auto [r, diagnostics] = train_one(seeds[s], runs.lr, false);
        runs.validation.push_back(metric.of(r.final_eval));
        runs.test.push_back(metric.of(r.final_test));
      }
      curves.push_back(runs.curve);
      char lr_text[32];
      std::snprintf(lr_text, sizeof lr_text, "%g", runs.lr);
      table += "| " + model + " | " + mean_std(metric, runs.test) + " | " +
               mean_std(metric, runs.validation) + " | " + lr_text + " | " +
               std::to_string(int(runs.seconds + 0.5)) + " |\n";
      std::string ranks, entropies;
      for (const json& layer : runs.diagnostics) {
        double rank = 0, entropy = 0;
        for (const json& r : layer["rank"]) rank += r.get<double>() / double(layer["rank"].size());
        for (const json& e : layer["row_entropy"])
          entropy += e.get<double>() / double(layer["row_entropy"].size());
        char text[64];
        std::snprintf(text, sizeof text, "%s%.0f", ranks.empty() ? "" : " / ", rank);
        ranks += text;
        std::snprintf(text, sizeof text, "%s%.2f", entropies.empty() ? "" : " / ", entropy);
        entropies += text;
      }
      diagnostics_table +=
          "| " + entry.label + " | " + model + " | " + ranks + " | " + entropies + " |\n";
      entry_json["models"].push_back({{"attention", model},
                                      {"lr", runs.lr},
                                      {"validation", runs.validation},
                                      {"test", runs.test},
                                      {"sweep", runs.sweep},
                                      {"train_seconds", runs.seconds},
                                      {"diagnostics", runs.diagnostics}});
    }
    const std::string png = (out / (slug(entry.label) + "-loss.png")).string();
    write_loss_png(png, entry.label + " (seed " + std::to_string(seeds.front()) + ", chosen lr)",
                   curves);
    entry_json["loss_png"] = png;
    report["entries"].push_back(entry_json);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report["wall_seconds"] = seconds;
  const std::string caption = "mhla compare, preset " + c.preset + ", " + std::to_string(threads) +
                              " threads, " + std::to_string(int(seconds + 0.5)) + " s in all.\n";
  const std::string diagnostics_section =
      "\nTrained attention on one validation sample (first seed, chosen rate), mean over heads per "
      "layer: "
      "numerical rank and mean row entropy (nats)\n\n| task | model | rank | row entropy "
      "|\n|---|---|---|---|\n" +
      diagnostics_table;
  std::printf("\n%s%s%s", caption.c_str(), table.c_str(), diagnostics_section.c_str());
  {
    std::ofstream md(out / "compare.md");
    md << caption << table << diagnostics_section;
    if (!md) throw Error((out / "compare.md").string() + ": cannot write");
  }
  if (!write_json_file((out / "compare.json").string(), report))
    throw Error("cannot write compare.json");
  std::printf(
      "wrote %s/compare.md, compare.json, the loss curves (*-loss.png) and per-run W heatmaps\n",
      c.out_dir.c_str());
  return 0;
}

}  // namespace mhla::tools
