#include <omp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>

#include "common/cli_checks.hpp"
#include "common/json_file.hpp"
#include "mhla/analysis.hpp"
#include "mhla/error.hpp"
#include "presets.hpp"
#include "train/fashion_mnist.hpp"
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
  std::string name() const { return bits_per_byte ? "bits per byte" : "accuracy"; }
  std::string format(double v) const {
    char text[32];
    std::snprintf(text, sizeof text, bits_per_byte ? "%.3f" : "%.1f%%",
                  bits_per_byte ? v : 100 * v);
    return text;
  }
};

// The paper's diagnosis on the trained model: numerical rank and mean row
// entropy of every head's attention matrix on the first held-out (validation)
// sample, and each MHLA layer's W as a PNG in `dir`, named relative to `out`.
json diagnose(train::Model<float>& model, const train::Task& task, const fs::path& dir,
              const fs::path& out) {
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
        const std::string name = "W-layer" + std::to_string(l) + "-head" + std::to_string(h);
        write_mixing_png((dir / (name + ".png")).string(), name,
                         std::vector<float>(w.begin() + h * m * m, w.begin() + (h + 1) * m * m), m);
        layer["mixing_png"].push_back(fs::relative(dir / (name + ".png"), out).string());
      }
    }
    layers.push_back(layer);
  }
  return layers;
}

std::string lr_text(double lr) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", lr);
  return text;
}

// Mean and sample standard deviation.
std::pair<double, double> mean_and_std(const std::vector<double>& values) {
  double mean = 0, var = 0;
  for (double a : values) mean += a / double(values.size());
  for (double a : values)
    var += (a - mean) * (a - mean) / double(std::max<size_t>(values.size() - 1, 1));
  return {mean, std::sqrt(var)};
}

std::string mean_std(const Metric& metric, const std::vector<double>& values) {
  const auto [mean, sd] = mean_and_std(values);
  std::string text = metric.format(mean);
  if (values.size() > 1) {
    const std::string sd_text = metric.format(sd);
    text += " ± " + (metric.bits_per_byte ? sd_text : sd_text.substr(0, sd_text.size() - 1));
  }
  return text;
}

// Training progress in epochs for images, in steps for sequences.
std::string progress(const train::RunConfig& config, int64_t steps) {
  char text[32];
  if (config.task != train::TaskKind::fashion_mnist) return std::to_string(steps);
  const int64_t images =
      config.train_images > 0 ? config.train_images : train::kFashionTrainableImages;
  std::snprintf(text, sizeof text, "%.1f", double(steps) / double(images / config.batch));
  return text;
}

struct ModelRuns {
  double lr = 0;
  bool lr_inside = false;                 // the chosen rate has a tried rate on either side
  std::vector<double> validation, test;   // one per seed
  std::vector<int64_t> best_step, steps;  // one per seed
  std::vector<json> sweep;                // the first seed at each rate
  LossSeries curve;                       // the first seed's run at the chosen rate
  json diagnostics;
  double seconds = 0, sweep_seconds = 0;
};

// A learning rate of the sweep and the validation score its run reached.
struct TriedRate {
  double lr;
  train::EvalPoint validation;
};

// The index of the best of the tried rates (the trainer's choice of the best
// evaluation: ties in accuracy go to the lower loss).
size_t best_rate(const std::vector<TriedRate>& tried, const Metric& metric) {
  std::vector<train::EvalPoint> points;
  for (const TriedRate& t : tried) points.push_back(t.validation);
  return size_t(train::best_evaluation(points, metric.bits_per_byte));
}

// The rate the sweep tries next (`tried` ascending by rate): none when the best
// one has a tried rate on either side or after kMaxExtensions extensions, else
// the next rate beyond the edge it sits on, at the grid's ratio there.
constexpr int kMaxExtensions = 3;
std::optional<double> next_rate(const std::vector<TriedRate>& tried, const Metric& metric,
                                int extensions) {
  if (tried.size() < 2 || extensions >= kMaxExtensions) return std::nullopt;
  const size_t best = best_rate(tried, metric), last = tried.size() - 1;
  if (best == 0) return tried[0].lr * tried[0].lr / tried[1].lr;
  if (best == last) return tried[last].lr * tried[last].lr / tried[last - 1].lr;
  return std::nullopt;
}

// The entries whose labels `labels` names, in the preset's order; all of them
// when `labels` is empty.
std::vector<ComparisonEntry> select_tables(std::vector<ComparisonEntry> entries,
                                           const std::vector<std::string>& labels) {
  if (labels.empty()) return entries;
  for (const std::string& label : labels)
    if (std::none_of(entries.begin(), entries.end(),
                     [&](const ComparisonEntry& e) { return e.label == label; })) {
      std::string known;
      for (const ComparisonEntry& e : entries)
        known += (known.empty() ? "'" : ", '") + e.label + "'";
      throw Error("--tables: no table '" + label + "' in this comparison; its tables are " + known);
    }
  std::erase_if(entries, [&](const ComparisonEntry& e) {
    return std::find(labels.begin(), labels.end(), e.label) == labels.end();
  });
  return entries;
}

// What a reader of one table needs to know that its rows do not say: the
// hybrid models' notation, why MHLA can match linear attention to the digit,
// and why softmax may be absent.
std::string table_notes(const ComparisonEntry& entry) {
  std::string notes;
  const auto has = [&](const char* model) {
    return std::find(entry.models.begin(), entry.models.end(), model) != entry.models.end();
  };
  for (const std::string& model : entry.models)
    if (model.find('/') != std::string::npos) {
      notes += "- `" + model + "`: one attention per layer, the first layer's first.\n";
      break;
    }
  const bool causal = entry.config.task != train::TaskKind::fashion_mnist;
  if (causal && entry.config.design.mixing_init == MixingTransform::uniform && has("mhla") &&
      has("linear"))
    notes +=
        "- MHLA starts here as exactly linear attention (its W starts uniform over the blocks "
        "each row reads, the authors' language-model init), so short runs keep the two "
        "close.\n";
  if (!has("softmax"))
    notes +=
        "- softmax is not in this table (its N x N attention is the slowest to train at this "
        "length); add it with `--attention softmax,linear,mhla`.\n";
  return notes.empty() ? "" : "\n" + notes;
}

// What every run of one invocation shares.
struct Comparison {
  const CompareCommand& c;
  std::vector<uint64_t> seeds;
  fs::path out;
  int threads;
};

// A finished run: its result, its diagnostics (first seed, chosen rate) and its
// smoothed training loss.
struct RunOutcome {
  train::RunResult result;
  json diagnostics;
  LossCurve train_curve;
};

// The last baseline table's task, label, and its first model's name and test
// scores.
struct Baseline {
  train::TaskKind task;
  std::string label, model;
  std::vector<double> test;
};

// The preset's tables with the command line's overrides, every model's name
// and settings checked before any training.
std::vector<ComparisonEntry> prepared_entries(const CompareCommand& c) {
  std::vector<ComparisonEntry> entries =
      select_tables(comparison_entries(c.tasks, c.preset), c.tables);
  for (ComparisonEntry& e : entries) {
    if (c.steps > 0) {
      e.config.steps = c.steps;
      e.config.warmup = std::min(e.config.warmup, c.steps / 10);
      e.config.eval_every = std::max<int64_t>(1, c.steps / 8);
      e.sweep_steps = std::min(e.sweep_steps, c.steps);
    }
    if (c.eval_size > 0) e.config.eval_samples = e.config.eval_images = c.eval_size;
    if (c.layers > 0) e.config.attention.assign(size_t(c.layers), e.config.attention.front());
    if (c.dim > 0) e.config.dim = c.dim;
    if (c.heads > 0) e.config.heads = c.heads;
    if (c.mlp_hidden > 0) e.config.mlp_hidden = c.mlp_hidden;
    apply_design_flags(*c.app, c.design, e.config.design);
    if (!c.attention.empty()) e.models = c.attention;
    if (!c.learning_rates.empty()) e.learning_rates = c.learning_rates;
    std::sort(e.learning_rates.begin(), e.learning_rates.end());
    for (const std::string& m : e.models) {
      train::RunConfig probe = e.config;
      apply_model(m, probe);
      if (c.layers > 0 && probe.attention.size() != size_t(c.layers))
        throw Error("--layers " + std::to_string(c.layers) + " but the model '" + m + "' lists " +
                    std::to_string(probe.attention.size()) + " layers");
      train::check_run_config(probe);
    }
  }
  return entries;
}

// One run, or its finished result from an earlier invocation with the same
// settings (a stopped comparison continues where it stopped: finished runs
// are read back, an unfinished one resumes from its checkpoint).
RunOutcome train_or_read_back(const Comparison& cmp, const ComparisonEntry& entry,
                              const Metric& metric, const std::string& model, uint64_t seed,
                              double lr, bool sweep) {
  train::RunConfig config = entry.config;
  config.seed = seed;
  config.lr = lr;
  const bool short_sweep = sweep && entry.sweep_steps > 0;
  if (short_sweep) {
    config.warmup = config.warmup * entry.sweep_steps / config.steps;
    config.steps = entry.sweep_steps;
  }
  apply_model(model, config);
  const bool diagnosed = seed == cmp.seeds.front() && !short_sweep;
  const fs::path dir = cmp.out / slug(entry.label) /
                       (slug(model) + "-lr" + lr_text(lr) + "-seed" + std::to_string(seed) +
                        (short_sweep ? "-sweep" : ""));
  fs::create_directories(dir);
  const std::string metrics = (dir / "metrics.json").string();
  std::optional<FinishedRun> done = read_finished_run(metrics, config);
  RunOutcome run;
  if (done && diagnosed) {
    if (fs::exists(dir / "diagnostics.json"))
      run.diagnostics = read_json_file((dir / "diagnostics.json").string());
    else
      done.reset();
  }
  if (done) {
    run.result = done->result;
    run.train_curve = done->train_curve;
  } else {
    train::RunOptions options;
    options.data_dir = config.task == train::TaskKind::fashion_mnist ? cmp.c.data_dir : "";
    options.checkpoint = (dir / "checkpoint.safetensors").string();
    options.checkpoint_every = config.eval_every;
    if (fs::exists(options.checkpoint)) options.resume = options.checkpoint;
    if (diagnosed)
      options.on_finish = [&](train::Model<float>& m, const train::Task& task) {
        run.diagnostics = diagnose(m, task, dir, cmp.out);
      };
    run.result = run_with_progress(config, options, entry.label + " " + model);
    if (diagnosed && !write_json_file((dir / "diagnostics.json").string(), run.diagnostics))
      throw Error((dir / "diagnostics.json").string() + ": cannot write");
    write_run_metrics(metrics, config, run.result, cmp.threads);
    run.train_curve = smoothed_train_loss(run.result.history.train_loss);
  }
  const train::RunResult& r = run.result;
  std::printf(
      "  %-14s lr %-7s seed %llu%s: validation %s, test %s (%s %s of %s), %.1f s, %.0f "
      "tokens/s%s\n",
      model.c_str(), lr_text(lr).c_str(), (unsigned long long)seed, short_sweep ? " sweep" : "",
      metric.format(metric.of(r.final_eval)).c_str(),
      metric.format(metric.of(r.final_test)).c_str(),
      config.task == train::TaskKind::fashion_mnist ? "epoch" : "step",
      progress(config, r.final_eval.step).c_str(), progress(config, r.steps_done).c_str(),
      r.history.seconds, r.tokens_per_second, done ? " (read back)" : "");
  std::fflush(stdout);
  return run;
}

// The first seed at every rate of the grid, widened until the best validation
// score lies inside it; that rate is the model's. One rate leaves nothing to
// choose, so no sweep run trains for it.
void choose_rate(const Comparison& cmp, const ComparisonEntry& entry, const Metric& metric,
                 const std::string& model, ModelRuns& mr) {
  if (entry.learning_rates.size() == 1) {
    mr.lr = entry.learning_rates.front();
    return;
  }
  std::vector<TriedRate> tried;  // ascending by rate
  const auto sweep_at = [&](double lr) {
    const train::RunResult r =
        train_or_read_back(cmp, entry, metric, model, cmp.seeds.front(), lr, true).result;
    tried.insert(std::upper_bound(tried.begin(), tried.end(), lr,
                                  [](double a, const TriedRate& b) { return a < b.lr; }),
                 {lr, r.final_eval});
    mr.sweep.push_back({{"lr", lr},
                        {"validation", metric.of(r.final_eval)},
                        {"test", metric.of(r.final_test)},
                        {"steps", r.steps_done},
                        {"train_seconds", r.history.seconds}});
    mr.sweep_seconds += r.history.seconds;
  };
  for (double lr : entry.learning_rates) sweep_at(lr);
  int extensions = 0;
  while (const std::optional<double> lr = next_rate(tried, metric, extensions)) {
    std::printf("  %s: the best rate is at the edge of the grid; trying %s\n", model.c_str(),
                lr_text(*lr).c_str());
    sweep_at(*lr);
    ++extensions;
  }
  const size_t best = best_rate(tried, metric);
  mr.lr = tried[best].lr;
  mr.lr_inside = best > 0 && best + 1 < tried.size();
}

// Every seed at the chosen rates, seed by seed, so that paired comparisons are
// complete as early as possible.
void run_seeds(const Comparison& cmp, const ComparisonEntry& entry, const Metric& metric,
               std::vector<ModelRuns>& runs) {
  for (uint64_t seed : cmp.seeds)
    for (size_t mi = 0; mi < entry.models.size(); ++mi) {
      ModelRuns& mr = runs[mi];
      const RunOutcome run =
          train_or_read_back(cmp, entry, metric, entry.models[mi], seed, mr.lr, false);
      const train::RunResult& r = run.result;
      mr.validation.push_back(metric.of(r.final_eval));
      mr.test.push_back(metric.of(r.final_test));
      mr.best_step.push_back(r.final_eval.step);
      mr.steps.push_back(r.steps_done);
      mr.seconds += r.history.seconds;
      if (seed == cmp.seeds.front()) {
        mr.curve = {entry.models[mi], run.train_curve, r.history.eval};
        mr.diagnostics = run.diagnostics;
      }
    }
}

// The entry's results table (its heading, a row per model and its notes); each
// model's row of the diagnostics table goes to `diagnostics_table`, its record
// to `entry_json`.
std::string results_table(const Comparison& cmp, const ComparisonEntry& entry, const Metric& metric,
                          const std::vector<ModelRuns>& runs, std::string& diagnostics_table,
                          json& entry_json) {
  const size_t seeds = cmp.seeds.size();
  const bool images = entry.config.task == train::TaskKind::fashion_mnist;
  std::string table =
      "\n**" + entry.label + "**: test " + metric.name() + ", mean ± std over " +
      std::to_string(seeds) + (seeds == 1 ? " seed" : " seeds") +
      " (learning rate chosen on validation" +
      (entry.sweep_steps > 0 ? " by " + progress(entry.config, entry.sweep_steps) +
                                   (images ? "-epoch" : "-step") + " runs of the first seed"
                             : "") +
      "; " + std::to_string(entry.config.attention.size()) + " layers of width " +
      std::to_string(entry.config.dim) + ", " + std::to_string(entry.config.heads) +
      " heads, MLP " + std::to_string(entry.config.mlp_hidden) +
      ")\n\n| model | test | validation | lr (tried) | " +
      (images ? "best epoch / epochs" : "best step / steps") +
      " | train min (runs + sweep) |\n|---|---:|---:|---:|---:|---:|\n";
  for (size_t mi = 0; mi < entry.models.size(); ++mi) {
    const ModelRuns& mr = runs[mi];
    train::RunConfig config = entry.config;
    apply_model(entry.models[mi], config);
    std::vector<double> rates;
    for (const json& s : mr.sweep) rates.push_back(s["lr"].get<double>());
    std::sort(rates.begin(), rates.end());
    std::string tried_rates;
    for (double lr : rates) tried_rates += (tried_rates.empty() ? "" : ", ") + lr_text(lr);
    if (rates.empty()) tried_rates = "given";
    std::vector<double> best_steps(mr.best_step.begin(), mr.best_step.end()),
        steps(mr.steps.begin(), mr.steps.end());
    char minutes[64];
    std::snprintf(minutes, sizeof minutes, "%.0f + %.0f", mr.seconds / 60, mr.sweep_seconds / 60);
    table += "| " + entry.models[mi] + " | " + mean_std(metric, mr.test) + " | " +
             mean_std(metric, mr.validation) + " | " + lr_text(mr.lr) +
             (mr.lr_inside || mr.sweep.size() < 2 ? "" : " (edge)") + " (" + tried_rates + ") | " +
             progress(config, int64_t(mean_and_std(best_steps).first + 0.5)) + " / " +
             progress(config, int64_t(mean_and_std(steps).first + 0.5)) + " | " + minutes + " |\n";
    std::string ranks, entropies;
    for (const json& layer : mr.diagnostics) {
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
        "| " + entry.label + " | " + entry.models[mi] + " | " + ranks + " | " + entropies + " |\n";
    entry_json["models"].push_back({{"attention", entry.models[mi]},
                                    {"lr", mr.lr},
                                    {"lr_inside_grid", mr.lr_inside},
                                    {"validation", mr.validation},
                                    {"test", mr.test},
                                    {"best_step", mr.best_step},
                                    {"steps", mr.steps},
                                    {"sweep", mr.sweep},
                                    {"train_seconds", mr.seconds},
                                    {"sweep_seconds", mr.sweep_seconds},
                                    {"diagnostics", mr.diagnostics}});
  }
  return table + table_notes(entry);
}

// Paired test differences, seed by seed: MHLA against every model without it
// (the same seed means the same initial weights of the shared parts and the
// same data order), and every model against the baseline table before this one
// (the same data order). Returns their table; records them in `entry_json`; a
// baseline entry becomes `baseline`.
std::string paired_differences(const Comparison& cmp, const ComparisonEntry& entry,
                               const Metric& metric, const std::vector<ModelRuns>& runs,
                               std::optional<Baseline>& baseline, json& entry_json) {
  const size_t seeds = cmp.seeds.size();
  std::string differences;
  const auto add_difference = [&](const std::string& minuend, const std::vector<double>& a,
                                  const std::string& subtrahend, const std::vector<double>& b,
                                  json record) {
    std::vector<double> d;
    std::string per_seed;
    for (size_t s = 0; s < seeds; ++s) {
      d.push_back((a[s] - b[s]) * (metric.bits_per_byte ? 1 : 100));
      char text[32];
      std::snprintf(text, sizeof text, "%s%+.*f", per_seed.empty() ? "" : ", ",
                    metric.bits_per_byte ? 3 : 1, d.back());
      per_seed += text;
    }
    const auto [mean, sd] = mean_and_std(d);
    char text[96];
    std::snprintf(text, sizeof text, "%+.*f ± %.*f", metric.bits_per_byte ? 3 : 1, mean,
                  metric.bits_per_byte ? 3 : 1, sd);
    differences += "| " + minuend + " − " + subtrahend + " | " + text + " | " + per_seed + " |\n";
    record["per_seed"] = d;
    entry_json["paired_test_differences"].push_back(record);
  };
  for (size_t a = 0; a < entry.models.size() && seeds > 1; ++a)
    for (size_t b = 0; b < entry.models.size(); ++b)
      if (entry.models[a].find("mhla") != std::string::npos &&
          entry.models[b].find("mhla") == std::string::npos)
        add_difference(entry.models[a], runs[a].test, entry.models[b], runs[b].test,
                       {{"minuend", entry.models[a]}, {"subtrahend", entry.models[b]}});
  if (entry.baseline) {
    baseline = Baseline{entry.config.task, entry.label, entry.models.front(), runs.front().test};
  } else if (baseline && baseline->task == entry.config.task && seeds > 1) {
    for (size_t a = 0; a < entry.models.size(); ++a)
      add_difference(entry.models[a], runs[a].test, baseline->label, baseline->test,
                     {{"minuend", entry.models[a]},
                      {"subtrahend", baseline->model},
                      {"subtrahend_table", baseline->label}});
  }
  if (differences.empty()) return "";
  return "\nPaired test differences (" +
         std::string(metric.bits_per_byte ? "bits per byte" : "accuracy points") +
         "), mean ± std over seeds\n\n| difference | mean ± std | per seed |\n|---|---:|---|\n" +
         differences;
}

// compare.md (printed too) and compare.json.
void write_report(const Comparison& cmp, const std::vector<ComparisonEntry>& entries, json& report,
                  const std::string& table, const std::string& diagnostics_table, double seconds) {
  report["wall_seconds"] = seconds;
  const std::string caption =
      "mhla-lab compare, preset " + cmp.c.preset + ", " + std::to_string(cmp.threads) + " threads, " +
      std::to_string(int(seconds + 0.5)) +
      " s in this invocation (runs read back from earlier ones are not counted).\n";
  const bool any_causal = std::any_of(entries.begin(), entries.end(), [](const ComparisonEntry& e) {
    return e.config.task != train::TaskKind::fashion_mnist;
  });
  const std::string diagnostics_section =
      "\nTrained attention on one validation sample (first seed, chosen rate), mean over heads per "
      "layer: numerical rank and mean row entropy (nats)" +
      std::string(any_causal ? ". A causal attention matrix is lower triangular with a non-zero "
                               "diagonal, so it has full rank whatever the attention: the rank "
                               "tells the attentions apart on the images only"
                             : "") +
      "\n\n| task | model | rank | row entropy |\n|---|---|---|---|\n" + diagnostics_table;
  std::printf("\n%s%s%s", caption.c_str(), table.c_str(), diagnostics_section.c_str());
  {
    std::ofstream md(cmp.out / "compare.md");
    md << caption << table << diagnostics_section;
    if (!md) throw Error((cmp.out / "compare.md").string() + ": cannot write");
  }
  if (!write_json_file((cmp.out / "compare.json").string(), report))
    throw Error("cannot write compare.json");
  std::printf(
      "wrote %s/compare.md, compare.json, the loss curves (*-loss.png) and per-run W heatmaps\n",
      cmp.c.out_dir.c_str());
}

}  // namespace

CLI::App* add_compare_command(CLI::App& app, CompareCommand& c) {
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Train the same small Transformer with softmax, linear attention and MHLA on byte-level "
      "text (KJV), Fashion-MNIST and MQAR. With several learning rates, the first seed picks "
      "each model's rate on the validation split, and the grid widens until the chosen rate "
      "lies inside it. Runs again with the same --out continue a stopped comparison: finished "
      "runs are read back, an unfinished one resumes from its checkpoint.\nWrites "
      "OUT/compare.md, OUT/compare.json, one loss PNG per table and, per run, metrics.json, "
      "diagnostics and MHLA's W as heatmaps.\nExamples:\n  mhla-lab compare --preset quick\n"
      "  mhla-lab compare --preset full --out runs/compare-full\n"
      "  mhla-lab compare --preset plateau --out runs/plateau\n"
      "  mhla-lab compare --tasks fashion-mnist --attention linear,mhla,mhla/mhla/softmax --seeds "
      "0,1,2");
  c.app = cmd;
  cmd->add_option("--preset", c.preset,
                  "quick (the shortest), full (short runs of all three tasks) or "
                  "plateau (Fashion-MNIST at 196 tokens on every image, early-stopped, with a "
                  "one-token baseline)")
      ->check(CLI::IsMember({"quick", "full", "plateau"}));
  cmd->add_option("--tasks", c.tasks, "text, fashion-mnist, mqar or all")
      ->check(CLI::IsMember({"text", "fashion-mnist", "mqar", "all"}));
  cmd->add_option(
         "--attention", c.attention,
         "comma list of models instead of the preset's: a kind for every layer, or kinds per layer "
         "joined "
         "by / (mhla/mhla/softmax); @INIT sets MHLA's initial mixing for that model (mhla@uniform)")
      ->delimiter(',');
  cmd->add_option("--seeds", c.seeds,
                  "seeds, comma separated (default: the preset's: quick 0, full and plateau 0,1,2)")
      ->delimiter(',');
  cmd->add_option("--lrs", c.learning_rates,
                  "peak learning rates to choose from on the validation split "
                  "(default: the preset's)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tables", c.tables,
                  "train only these tables of the preset, by label, comma separated (e.g. "
                  "\"fashion-mnist 1 token,fashion-mnist 196 tokens + conv(v)\"); default: all")
      ->delimiter(',');
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
  cmd->add_option("--layers", c.layers,
                  "layers of every model, the one-token baseline's included, instead of the "
                  "preset's (use a new --out: runs of another size are other runs)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--dim", c.dim, "model width of every model instead of the preset's")
      ->check(positive_integer());
  cmd->add_option("--heads", c.heads, "attention heads of every model instead of the preset's")
      ->check(positive_integer());
  cmd->add_option("--mlp", c.mlp_hidden, "MLP hidden width of every model instead of the preset's")
      ->check(positive_integer());
  add_design_flags(*cmd, c.design);
  return cmd;
}

int run_compare_command(const CompareCommand& c) {
  if (c.threads > 0) omp_set_num_threads(c.threads);
  const std::vector<ComparisonEntry> entries = prepared_entries(c);
  const Comparison cmp{c,
                       !c.seeds.empty()      ? c.seeds
                       : c.preset != "quick" ? std::vector<uint64_t>{0, 1, 2}
                                             : std::vector<uint64_t>{0},
                       fs::path(c.out_dir), omp_get_max_threads()};
  fs::create_directories(cmp.out);
  const auto start = std::chrono::steady_clock::now();

  json report = {{"preset", c.preset},
                 {"threads", cmp.threads},
                 {"seeds", cmp.seeds},
                 {"entries", json::array()}};
  std::string table, diagnostics_table;
  std::optional<Baseline> baseline;
  for (const ComparisonEntry& entry : entries) {
    const Metric metric{train::scored_by_loss(entry.config.task)};
    std::printf("== %s: %lld steps of %lld per run, %zu learning rate(s), seeds",
                entry.label.c_str(), (long long)entry.config.steps, (long long)entry.config.batch,
                entry.learning_rates.size());
    for (uint64_t s : cmp.seeds) std::printf(" %llu", (unsigned long long)s);
    std::printf(", %d threads\n", cmp.threads);
    std::fflush(stdout);
    json entry_json = {{"label", entry.label},
                       {"config", train::to_json(entry.config)},
                       {"metric", metric.name()},
                       {"sweep_steps", entry.sweep_steps},
                       {"models", json::array()}};

    std::vector<ModelRuns> runs(entry.models.size());
    for (size_t mi = 0; mi < entry.models.size(); ++mi)
      choose_rate(cmp, entry, metric, entry.models[mi], runs[mi]);
    run_seeds(cmp, entry, metric, runs);

    table += results_table(cmp, entry, metric, runs, diagnostics_table, entry_json);
    table += paired_differences(cmp, entry, metric, runs, baseline, entry_json);
    std::vector<LossSeries> curves;
    for (const ModelRuns& mr : runs) curves.push_back(mr.curve);
    const std::string png = slug(entry.label) + "-loss.png";
    write_loss_png((cmp.out / png).string(),
                   entry.label + " (seed " + std::to_string(cmp.seeds.front()) + ", chosen lr)",
                   curves);
    entry_json["loss_png"] = png;
    report["entries"].push_back(entry_json);
  }
  write_report(cmp, entries, report, table, diagnostics_table,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace mhla::tools
