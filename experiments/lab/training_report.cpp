#include "training_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "common/gnuplot.hpp"
#include "common/json_file.hpp"
#include "common/progress.hpp"
#include "mhla/error.hpp"

namespace mhla::tools {

using nlohmann::json;

train::RunResult run_with_progress(const train::RunConfig& config, train::RunOptions options,
                                   const std::string& title) {
  ProgressBar bar(double(config.steps));
  int64_t shown = 0;
  options.on_step = [&](int64_t done, int64_t total, double loss, double tokens_per_second) {
    char label[160];
    std::snprintf(label, sizeof label, "%s  step %lld/%lld  loss %.4f nats  %.0f tok/s", title.c_str(),
                  (long long)done, (long long)total, loss, tokens_per_second);
    bar.advance(double(done - shown), label);
    shown = done;
    // Logs and pipes get a line every tenth of the run instead of the bar.
    if (!bar.visible() && (done * 10 / total != (done - 1) * 10 / total || done == total)) {
      std::printf("  %s\n", label);
      std::fflush(stdout);
    }
  };
  if (!options.resume.empty()) bar.advance(0, title + "  resuming");
  return train::run_training(config, options);
}

LossCurve smoothed_train_loss(const std::vector<double>& per_step, size_t points) {
  // A moving average over ~2% of the run: per-batch losses are too noisy to compare by eye.
  const size_t n = per_step.size();
  const double keep = 1.0 - 1.0 / std::max(1.0, double(n) / 50.0);
  LossCurve curve;
  double average = n ? per_step[0] : 0;
  size_t next = 0;  // the index of the next kept point
  for (size_t step = 0; step < n; ++step) {
    average = keep * average + (1 - keep) * per_step[step];
    if (step != next && step + 1 != n) continue;
    char rounded[32];
    std::snprintf(rounded, sizeof rounded, "%.5g", average);
    curve.emplace_back(double(step + 1), std::atof(rounded));
    next = points > 1 ? std::max(step + 1, (curve.size() * (n - 1)) / (points - 1)) : n;
  }
  return curve;
}

namespace {

// The trainer's history without its per-step arrays, with the curve instead.
json history_summary(const train::History& h) {
  json j = train::to_json(h);
  j.erase("train_loss");
  j.erase("train_accuracy");
  json steps = json::array(), losses = json::array();
  for (const auto& [step, loss] : smoothed_train_loss(h.train_loss)) {
    steps.push_back(int64_t(step));
    losses.push_back(loss);
  }
  j["train_curve"] = {{"step", steps}, {"smoothed_loss", losses}};
  return j;
}

// The history of a metrics file (its per-step arrays empty) and its curve:
// the summary above, or the per-step history files once held.
std::pair<train::History, LossCurve> history_of(const json& j) {
  if (j.contains("train_loss")) {
    train::History h = train::history_from_json(j);
    LossCurve curve = smoothed_train_loss(h.train_loss);
    h.train_loss.clear();
    h.train_accuracy.clear();
    return {h, curve};
  }
  json full = j;
  full["train_loss"] = json::array();
  full["train_accuracy"] = json::array();
  const train::History h = train::history_from_json(full);
  const json& steps = j.at("train_curve").at("step");
  const json& losses = j.at("train_curve").at("smoothed_loss");
  if (steps.size() != losses.size())
    throw Error("training history: the curve's steps and losses differ in length");
  LossCurve curve;
  for (size_t i = 0; i < steps.size(); ++i)
    curve.emplace_back(steps[i].get<double>(), losses[i].get<double>());
  return {h, curve};
}

}  // namespace

void write_run_metrics(const std::string& path, const train::RunConfig& config,
                       const train::RunResult& r, int threads) {
  json j = {{"config", train::to_json(config)},
            {"threads", threads},
            {"parameters", r.parameters},
            {"steps_done", r.steps_done},
            {"finished", r.finished},
            {"stopped_early", r.stopped_early},
            {"train_seconds", r.history.seconds},
            {"tokens_per_second", r.tokens_per_second},
            {"history", history_summary(r.history)}};
  if (r.finished) {
    j["final_eval"] = {{"split", "validation"},
                       {"step", r.final_eval.step},
                       {"loss", r.final_eval.loss},
                       {"accuracy", r.final_eval.accuracy}};
    j["final_test"] = {{"split", "test"},
                       {"step", r.final_test.step},
                       {"loss", r.final_test.loss},
                       {"accuracy", r.final_test.accuracy}};
  }
  if (!write_json_file(path, j)) throw Error(path + ": cannot write");
}

std::optional<FinishedRun> read_finished_run(const std::string& path,
                                             const train::RunConfig& config) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  const json j = read_json_file(path);
  try {
    if (!j.at("finished").get<bool>() || j.at("config") != train::to_json(config))
      return std::nullopt;
    FinishedRun run;
    train::RunResult& r = run.result;
    r.finished = true;
    std::tie(r.history, run.train_curve) = history_of(j.at("history"));
    j.at("parameters").get_to(r.parameters);
    j.at("steps_done").get_to(r.steps_done);
    j.at("stopped_early").get_to(r.stopped_early);
    j.at("tokens_per_second").get_to(r.tokens_per_second);
    for (auto [key, point] :
         {std::pair{"final_eval", &r.final_eval}, {"final_test", &r.final_test}})
      *point = {j.at(key).at("step").get<int64_t>(), j.at(key).at("loss").get<double>(),
                j.at(key).at("accuracy").get<double>()};
    return run;
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not the metrics of a training run (" + e.what() + ")");
  }
}

void write_mixing_png(const std::string& png, const std::string& title, const std::vector<float>& w,
                      int64_t m) {
  std::string rows = "$w << EOD\n";
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < m; ++b)
      rows.append(b ? " " : "").append(std::to_string(w[size_t(i * m + b)]));
    rows += "\n";
  }
  rows += "EOD\n";
  // viridis: dark = 0, yellow = the largest weight.
  draw_png_with_gnuplot(
      png, 640, 560,
      rows +
          "set palette defined (0 '#440154', 0.25 '#3b528b', 0.5 '#21918c', 0.75 '#5ec962', "
          "1 '#fde725')\nset cbrange [0:*]\nset cblabel 'W[i, b]'\nset size ratio -1\n"
          "set xrange [-0.5:" +
          std::to_string(m - 0.5) + "]\nset yrange [" + std::to_string(m - 0.5) +
          ":-0.5]\nset xlabel 'key block b'\nset ylabel 'query block i'\nset title '" + title +
          "'\nplot $w matrix with image notitle\n");
}

void write_loss_png(const std::string& png, const std::string& title,
                    const std::vector<LossSeries>& series) {
  std::string data, plot;
  for (size_t i = 0; i < series.size(); ++i) {
    const LossSeries& s = series[i];
    std::vector<std::pair<double, double>> eval;
    for (const train::EvalPoint& e : s.eval) eval.emplace_back(double(e.step), e.loss);
    const std::string name = "$t" + std::to_string(i), eval_name = "$e" + std::to_string(i);
    const std::string colour = " lc " + std::to_string(i + 1);
    data += gnuplot_data_block(name, s.train_curve) + gnuplot_data_block(eval_name, eval);
    plot += std::string(plot.empty() ? "plot " : ", ") + name + " using 1:2 with lines lw 2" +
            colour + " title '" + s.title + " (train)', " + eval_name +
            " using 1:2 with points pt 7" + colour + " title '" + s.title + " (eval)'";
  }
  draw_png_with_gnuplot(png, 900, 600,
                        data +
                            "set logscale y\nset grid\nset key top right\nset xlabel 'step'\n"
                            "set ylabel 'cross-entropy loss'\nset title '" +
                            title + "'\n" + plot);
}

}  // namespace mhla::tools
