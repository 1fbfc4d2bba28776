#include "training_report.hpp"

#include <cstdio>
#include <filesystem>

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
            {"history", train::to_json(r.history)}};
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

std::optional<train::RunResult> read_finished_run(const std::string& path,
                                                  const train::RunConfig& config) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  const json j = read_json_file(path);
  try {
    if (!j.at("finished").get<bool>() || j.at("config") != train::to_json(config))
      return std::nullopt;
    train::RunResult r;
    r.finished = true;
    r.history = train::history_from_json(j.at("history"));
    j.at("parameters").get_to(r.parameters);
    j.at("steps_done").get_to(r.steps_done);
    j.at("stopped_early").get_to(r.stopped_early);
    j.at("tokens_per_second").get_to(r.tokens_per_second);
    for (auto [key, point] :
         {std::pair{"final_eval", &r.final_eval}, {"final_test", &r.final_test}})
      *point = {j.at(key).at("step").get<int64_t>(), j.at(key).at("loss").get<double>(),
                j.at(key).at("accuracy").get<double>()};
    return r;
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
    // A moving average over ~2% of the run: per-batch losses are too noisy to compare by eye.
    const double keep = 1.0 - 1.0 / std::max(1.0, double(s.train_loss.size()) / 50.0);
    std::vector<std::pair<double, double>> smooth, eval;
    double average = s.train_loss.empty() ? 0 : s.train_loss[0];
    for (size_t step = 0; step < s.train_loss.size(); ++step) {
      average = keep * average + (1 - keep) * s.train_loss[step];
      smooth.emplace_back(double(step + 1), average);
    }
    for (const train::EvalPoint& e : s.eval) eval.emplace_back(double(e.step), e.loss);
    const std::string name = "$t" + std::to_string(i), eval_name = "$e" + std::to_string(i);
    const std::string colour = " lc " + std::to_string(i + 1);
    data += gnuplot_data_block(name, smooth) + gnuplot_data_block(eval_name, eval);
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
