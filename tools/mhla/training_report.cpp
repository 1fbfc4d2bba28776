#include "training_report.hpp"

#include <cstdio>

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
    std::snprintf(label, sizeof label, "%s  step %lld/%lld  loss %.4f  %.0f tok/s", title.c_str(),
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
            {"train_seconds", r.history.seconds},
            {"tokens_per_second", r.tokens_per_second},
            {"history", train::to_json(r.history)}};
  if (r.finished) {
    j["final_eval"] = {
        {"split", "validation"}, {"loss", r.final_eval.loss}, {"accuracy", r.final_eval.accuracy}};
    j["final_test"] = {
        {"split", "test"}, {"loss", r.final_test.loss}, {"accuracy", r.final_test.accuracy}};
  }
  if (!write_json_file(path, j)) throw Error(path + ": cannot write");
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
