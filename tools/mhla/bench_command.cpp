#include "bench_command.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/crossover.hpp"
#include "common/gnuplot.hpp"
#include "common/json_file.hpp"
#include "common/progress.hpp"
#include "common/timing.hpp"
#include "common/workload.hpp"
#include "mhla/error.hpp"

namespace mhla::tools {
namespace {

using nlohmann::json;

const char* const kMethods[] = {"softmax", "linear", "mhla"};

void run_method(Workload& wl, const std::string& method) {
  if (method == "softmax") wl.softmax_forward();
  if (method == "linear") wl.linear_forward();
  if (method == "mhla") wl.mhla_forward();
}

// Child process: builds the workload, runs one forward of `method`, prints
// the peak RSS before and after as JSON.
int memory_probe(const std::vector<std::string>& args) {
  const std::string method = args.at(0);
  const int64_t n = std::stoll(args.at(1)), dim = std::stoll(args.at(2)),
                heads = std::stoll(args.at(3)), blocks = std::stoll(args.at(4));
  const double before = peak_rss_bytes();
  Workload wl(1, n, heads, dim, blocks);
  run_method(wl, method);
  std::printf(
      "%s\n",
      json{{"rss_before_bytes", before}, {"peak_rss_bytes", peak_rss_bytes()}}.dump().c_str());
  return 0;
}

struct Result {
  int threads;
  int64_t dim, tokens, blocks;
  std::string method;
  double seconds = 0, peak_rss_bytes = 0;
};

// gnuplot commands: log-log forward time vs N, one line per (method, D,
// threads), each series an inline data block; the crossover marked.
std::string plot_commands(const std::vector<Result>& results, const std::vector<int>& threads,
                          const std::vector<int64_t>& dims, int64_t crossover) {
  std::string data, plot;
  int series = 0;
  for (int t : threads)
    for (int64_t d : dims)
      for (const char* m : kMethods) {
        std::vector<std::pair<double, double>> points;
        for (const Result& r : results)
          if (r.threads == t && r.dim == d && r.method == m)
            points.emplace_back(double(r.tokens), r.seconds);
        if (points.empty()) continue;
        const std::string name = "$s" + std::to_string(series++);
        data += gnuplot_data_block(name, points);
        plot += std::string(plot.empty() ? "plot " : ", ") + name +
                " using 1:2 with linespoints title '" + m + " (D=" + std::to_string(d) + ", " +
                std::to_string(t) + (t == 1 ? " thread)'" : " threads)'");
      }
  std::string s = data + "set logscale xy\nset grid\nset key right bottom\n";
  s += "set xlabel 'tokens N'\nset ylabel 'forward time (s)'\n";
  s += "set title 'softmax vs linear attention vs MHLA (forward, fp32, B=1)'\n";
  if (crossover > 0)
    s += "set arrow from " + std::to_string(crossover) + ", graph 0 to " +
         std::to_string(crossover) +
         ", graph 1 nohead dashtype 2 lc rgb 'gray40'\nset label 'crossover: MHLA faster than "
         "softmax from N = " +
         std::to_string(crossover) + "' at graph 0.02, graph 0.95\n";
  return s + plot;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchCommand& c) {
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Forward time and peak memory of softmax, linear attention and MHLA over N, D and threads\n"
      "(B = 1, elu+1, normalized, M = sqrt(N) unless --blocks). Writes bench.csv, bench.json and\n"
      "bench.png (log-log time vs N, crossover marked).\n"
      "Example: mhla bench --tokens 1024,4096,16384 --dims 32,64 --threads 1,2 --out-dir results/");
  cmd->add_option("--tokens", c.tokens, "sequence lengths N")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t(16), int64_t(1) << 22));
  cmd->add_option("--dims", c.dims, "head dimensions D")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option("--threads", c.threads, "OpenMP thread counts (default: all cores)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--heads", c.heads, "heads H")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(256)));
  cmd->add_option("--blocks", c.blocks, "MHLA blocks M (0: round(sqrt(N)))")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), kMaxDenseMixingBlocks));
  cmd->add_option("--softmax-max-tokens", c.softmax_max_tokens,
                  "skip softmax above this N (it is O(N^2))")
      ->capture_default_str();
  cmd->add_option("--repeats", c.repeats, "timed repeats per point (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("!--no-memory", c.memory,
                "skip the peak-memory measurements (one child process each)");
  cmd->add_option("--out-dir", c.out_dir, "directory for bench.csv, bench.json, bench.png")
      ->capture_default_str();
  cmd->add_flag("--force", c.force, "overwrite existing output files");
  cmd->add_option("--memory-probe", c.memory_probe, "internal")->expected(5)->group("");
  return cmd;
}

int run_bench_command(const BenchCommand& c) {
  if (!c.memory_probe.empty()) return memory_probe(c.memory_probe);
  const std::filesystem::path dir(c.out_dir);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw Error("cannot create --out-dir '" + c.out_dir + "': " + error.message());
  for (const char* name : {"bench.csv", "bench.json", "bench.png"})
    if (!c.force && std::filesystem::exists(dir / name))
      throw Error((dir / name).string() +
                  ": already exists; refusing to overwrite it (pass --force)");

  const std::vector<int> threads =
      c.threads.empty() ? std::vector<int>{omp_get_max_threads()} : c.threads;
  // Progress weights: MHLA and linear cost ~N, softmax ~N^2 / 1024.
  double total = 0;
  for (size_t t = 0; t < threads.size(); ++t)
    for (int64_t d : c.dims)
      for (int64_t n : c.tokens)
        total += double(d) *
                 (2.0 * double(n) + (n <= c.softmax_max_tokens ? double(n) * double(n) / 1024 : 0));
  ProgressBar progress(total);
  std::vector<Result> results;
  for (int t : threads) {
    omp_set_num_threads(t);
    for (int64_t d : c.dims)
      for (int64_t n : c.tokens) {
        const int64_t m = c.blocks > 0 ? std::min(c.blocks, n) : blocks_for(n);
        progress.advance(0, "N=" + std::to_string(n) + " D=" + std::to_string(d) +
                                " threads=" + std::to_string(t));
        Workload wl(1, n, c.heads, d, m);
        std::vector<std::string> methods = {"linear", "mhla"};
        if (n <= c.softmax_max_tokens) methods.insert(methods.begin(), "softmax");
        std::vector<std::function<void()>> runs;
        for (const std::string& method : methods)
          runs.push_back([&wl, method] { run_method(wl, method); });
        const std::vector<double> seconds = interleaved_medians(runs, c.repeats);
        for (size_t i = 0; i < methods.size(); ++i) {
          Result r{t, d, n, m, methods[i], seconds[i], 0};
          if (c.memory) {
            const json probe = json::parse(
                run_self({"bench", "--memory-probe", methods[i], std::to_string(n),
                          std::to_string(d), std::to_string(c.heads), std::to_string(m)}));
            r.peak_rss_bytes = probe["peak_rss_bytes"];
          }
          results.push_back(r);
        }
        progress.advance(
            double(d) *
                (2.0 * double(n) + (n <= c.softmax_max_tokens ? double(n) * double(n) / 1024 : 0)),
            "");
      }
  }

  // The crossover (first thread/dim pair): from which N on MHLA beats softmax
  // at every measured N.
  std::vector<SweepPoint> points;
  for (int64_t n : c.tokens) {
    SweepPoint p{n, 0, 0};
    for (const Result& r : results)
      if (r.threads == threads[0] && r.dim == c.dims[0] && r.tokens == n) {
        if (r.method == "softmax") p.softmax_seconds = r.seconds;
        if (r.method == "mhla") p.mhla_seconds = r.seconds;
      }
    if (p.softmax_seconds > 0) points.push_back(p);
  }
  std::sort(points.begin(), points.end(),
            [](const SweepPoint& a, const SweepPoint& b) { return a.tokens < b.tokens; });
  const int64_t crossover = faster_from(points);

  const std::string csv = (dir / "bench.csv").string(), png = (dir / "bench.png").string();
  {
    std::ofstream out(csv);
    out << "threads,dim,heads,tokens,blocks,method,seconds,peak_rss_bytes\n";
    for (const Result& r : results)
      out << r.threads << ',' << r.dim << ',' << c.heads << ',' << r.tokens << ',' << r.blocks
          << ',' << r.method << ',' << r.seconds << ',' << r.peak_rss_bytes << '\n';
    if (!out) throw Error(csv + ": cannot write");
  }
  json summary = {
      {"heads", c.heads}, {"batch", 1}, {"feature_map", "elu1"}, {"crossover_tokens", crossover}};
  std::printf("%7s %5s %7s %7s %8s %12s %14s\n", "threads", "D", "N", "M", "method", "forward (s)",
              "peak RSS (MiB)");
  for (const Result& r : results) {
    std::printf("%7d %5lld %7lld %7lld %8s %12.6f %14.1f\n", r.threads, (long long)r.dim,
                (long long)r.tokens, (long long)r.blocks, r.method.c_str(), r.seconds,
                r.peak_rss_bytes / (1 << 20));
    summary["results"].push_back({{"threads", r.threads},
                                  {"dim", r.dim},
                                  {"tokens", r.tokens},
                                  {"blocks", r.blocks},
                                  {"method", r.method},
                                  {"seconds", r.seconds},
                                  {"peak_rss_bytes", r.peak_rss_bytes}});
  }
  if (crossover > 0)
    std::printf("MHLA's forward is faster than softmax at every measured N from %lld on (threads %d, D %lld)\n",
                (long long)crossover, threads[0], (long long)c.dims[0]);
  else
    std::printf("MHLA's forward is not faster than softmax at the largest measured N\n");
  if (!write_json_file((dir / "bench.json").string(), summary)) return 1;

  try {
    draw_png_with_gnuplot(png, 900, 600, plot_commands(results, threads, c.dims, crossover));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; " + csv + " and bench.json are written");
  }
  std::printf("wrote %s, %s, %s\n", csv.c_str(), (dir / "bench.json").string().c_str(),
              png.c_str());
  return 0;
}

}  // namespace mhla::tools
