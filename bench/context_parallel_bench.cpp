// Context-parallel MHLA over MPI: time per training step (forward + backward)
// and bytes each rank hands to MPI, at growing N with M fixed (the bytes must
// not grow) and at growing M with N fixed (they grow with M). Run it under
// mpirun with 1 and 2 ranks; rank 0 prints a table and writes JSON.
//
//   mpirun -np 2 mhla_context_parallel_bench --tokens 65536,262144,1048576 --json cp.json
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "common/json_file.hpp"
#include "common/timing.hpp"
#include "mhla/context_parallel_mpi.hpp"
#include "mhla/error.hpp"
#include "mhla/mixing_init.hpp"
#include "mhla/operator.hpp"

namespace {

using namespace mhla;

struct Point {
  int64_t tokens, blocks;
};

struct Measured {
  double seconds;                  // median step, slowest rank
  ContextParallelTraffic traffic;  // one step, the rank that sent most
  double fused_seconds = 0;        // 1 rank: mhla::forward + mhla::backward, same inputs
};

// toeplitz_length >= 0: Toeplitz w of that L (masked modes), else dense W.
Measured measure(const Point& p, int64_t heads, int64_t dim, Masking masking,
                 int64_t toeplitz_length, int repeats) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int64_t block = p.tokens / p.blocks;
  // Whole blocks per rank, the remainder on the last ranks.
  const int64_t blocks_here = p.blocks / ranks + (rank >= ranks - p.blocks % ranks ? 1 : 0);
  const int64_t n = blocks_here * block;
  Options options;
  options.layout = TokenLayout::sequence(p.tokens, block);
  options.masking = masking;
  options.feature_map = FeatureMap::elu1;
  std::mt19937 rng(1234 + uint32_t(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int64_t> shape = {1, n, heads, dim};
  std::vector<float> q(size_t(n * heads * dim)), k(q.size()), v(q.size()), g(q.size());
  for (auto* x : {&q, &k, &v, &g})
    for (float& e : *x) e = normal(rng);
  std::vector<float> o(q.size()), gq(q.size()), gk(q.size()), gv(q.size());
  MixingInit init;
  init.causal = masking != Masking::none;
  const bool toeplitz = toeplitz_length >= 0;
  options.mixing = toeplitz ? MixingForm::toeplitz : MixingForm::dense;
  const std::vector<float> w =
      toeplitz ? init_toeplitz_mixing(toeplitz_length, init) : init_mixing(options.layout, init);
  std::vector<float> gw(w.size());
  const std::vector<int64_t> w_shape = toeplitz ? std::vector<int64_t>{toeplitz_length + 1}
                                                : std::vector<int64_t>{p.blocks, p.blocks};
  ContextParallelTraffic step;
  auto run = [&] {
    step = {};
    context_parallel_forward<float>(MPI_COMM_WORLD, options, {q.data(), shape}, {k.data(), shape},
                                    {v.data(), shape}, {w.data(), w_shape}, {o.data(), shape},
                                    &step);
    context_parallel_backward<float>(MPI_COMM_WORLD, options, {q.data(), shape}, {k.data(), shape},
                                     {v.data(), shape}, {w.data(), w_shape}, {o.data(), shape},
                                     {g.data(), shape}, {gq.data(), shape}, {gk.data(), shape},
                                     {gv.data(), shape}, {gw.data(), w_shape}, &step);
  };
  // A fixed repeat count: every rank must make the same calls.
  tools::TimingPolicy policy;
  policy.min_repeats = policy.max_repeats = repeats;
  policy.min_seconds = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  double seconds = tools::median_seconds(run, policy), slowest = 0;
  MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int64_t mine[4] = {step.summary_bytes_sent, step.summary_bytes_received, step.reduction_bytes,
                     step.control_bytes},
          most[4];
  MPI_Allreduce(mine, most, 4, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  Measured result{slowest, {most[0], most[1], most[2], most[3]}};
  if (ranks == 1)  // what the phases and the exchange cost over the fused operator
    result.fused_seconds = tools::median_seconds(
        [&] {
          forward<float>(options, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                         {w.data(), w_shape}, {o.data(), shape});
          backward<float>(options, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                          {w.data(), w_shape}, {o.data(), shape}, {g.data(), shape},
                          {gq.data(), shape}, {gk.data(), shape}, {gv.data(), shape},
                          {gw.data(), w_shape});
        },
        policy);
  return result;
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    out.push_back(std::stoll(text.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CLI::App app("Context-parallel MHLA over MPI: step time and bytes per rank");
  std::string tokens = "65536,262144,1048576", blocks = "64", fixed_n_blocks = "16,64,256",
              json_path, masking = "none";
  int64_t fixed_n = 65536, heads = 8, dim = 64;
  int repeats = 3;
  int64_t toeplitz_length = -1;
  app.add_option("--tokens", tokens, "N values at fixed M (comma-separated)")
      ->capture_default_str();
  app.add_option("--blocks", blocks, "M for the N sweep")->capture_default_str();
  app.add_option("--fixed-n", fixed_n, "N of the M sweep")->capture_default_str();
  app.add_option("--m-sweep", fixed_n_blocks, "M values at N = --fixed-n")->capture_default_str();
  app.add_option("--heads", heads, "H")->capture_default_str();
  app.add_option("--dim", dim, "Dk = Dv")->capture_default_str();
  app.add_option("--masking", masking, "none, causal or block_causal")->capture_default_str();
  app.add_option("--toeplitz-length", toeplitz_length,
                 "Toeplitz w with this L (causal or block_causal; default: dense W)");
  app.add_option("--repeats", repeats, "timed steps per point (median)")->capture_default_str();
  app.add_option("--json", json_path, "write the results here (rank 0)");
  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    status = rank == 0 ? app.exit(e) : 1;
    MPI_Finalize();
    return status;
  }
  std::vector<Point> points;
  const int64_t m = parse_list(blocks).at(0);
  for (int64_t n : parse_list(tokens)) points.push_back({n, m});
  for (int64_t mm : parse_list(fixed_n_blocks)) points.push_back({fixed_n, mm});
  nlohmann::json results = nlohmann::json::array();
  if (rank == 0)
    std::printf(
        "ranks %d, B=1, H=%lld, Dk=Dv=%lld, fp32, masking %s, %s mixing, forward + backward\n"
        "%9s %6s %12s %16s %16s %14s %12s %16s\n",
        ranks, (long long)heads, (long long)dim, masking.c_str(),
        toeplitz_length >= 0 ? ("Toeplitz L = " + std::to_string(toeplitz_length)).c_str()
                             : "dense",
        "N", "M", "step ms", "summary B sent", "summary B recv", "grad_w B", "control B",
        "fused 1-proc ms");
  try {
    for (const Point& p : points) {
      const Measured r = measure(p, heads, dim, parse_masking(masking), toeplitz_length, repeats);
      if (rank != 0) continue;
      const std::string fused = ranks == 1 ? std::to_string(1e3 * r.fused_seconds) : "-";
      std::printf("%9lld %6lld %12.2f %16lld %16lld %14lld %12lld %16.7s\n", (long long)p.tokens,
                  (long long)p.blocks, 1e3 * r.seconds, (long long)r.traffic.summary_bytes_sent,
                  (long long)r.traffic.summary_bytes_received, (long long)r.traffic.reduction_bytes,
                  (long long)r.traffic.control_bytes, fused.c_str());
      std::fflush(stdout);
      results.push_back({{"ranks", ranks},
                         {"tokens", p.tokens},
                         {"blocks", p.blocks},
                         {"heads", heads},
                         {"dim", dim},
                         {"masking", masking},
                         {"toeplitz_length", toeplitz_length},
                         {"step_seconds", r.seconds},
                         {"summary_bytes_sent", r.traffic.summary_bytes_sent},
                         {"summary_bytes_received", r.traffic.summary_bytes_received},
                         {"reduction_bytes", r.traffic.reduction_bytes},
                         {"control_bytes", r.traffic.control_bytes},
                         {"fused_step_seconds",
                          ranks == 1 ? nlohmann::json(r.fused_seconds) : nlohmann::json(nullptr)}});
    }
  } catch (const mhla::Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    status = 1;
  }
  if (rank == 0 && !json_path.empty() && status == 0 && !tools::write_json_file(json_path, results))
    status = 1;
  MPI_Finalize();
  return status;
}
