// What the public backward's check of saved summaries and mixed summaries
// costs (core/saved_state_check.hpp): backward() with both arrays saved, as
// a caller outside the library hands them in (checked), against the same
// call reading a ForwardState (the trainer; the torch layers' arrays are as
// private: not checked), and the check alone, all timed in this process on the same
// tensors, alternating. B = 1, H = 8, D = 64, elu+1, M = round(sqrt(N)),
// float32.
//
//   mhla_saved_state_check_bench [--tokens 16384 65536] [--json FILE]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_file.hpp"
#include "common/timing.hpp"
#include "common/workload.hpp"
#include "core/block_table.hpp"
#include "core/saved_state_check.hpp"
#include "core/validate.hpp"

using namespace mhla;

int main(int argc, char** argv) {
  CLI::App app("Cost of backward's check of saved state");
  std::vector<int64_t> tokens = {16384, 65536};
  std::string json_path;
  app.add_option("--tokens", tokens, "sequence lengths");
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%8s %5s %14s %14s %10s %8s\n", "N", "M", "checked ms", "unchecked ms", "check ms",
              "share");
  for (int64_t n : tokens) {
    tools::Workload wl(1, n, 8, 64, tools::blocks_for(n));
    wl.mhla_forward_saving();
    wl.mhla_forward_saving_arrays();
    const std::vector<int64_t> shape = wl.shape();
    const TensorView<const float> q{wl.q.data(), shape}, k{wl.k.data(), shape},
        v{wl.v.data(), shape}, w{wl.w.data(), wl.w_shape()};
    detail::Problem p = detail::validate_mhla("bench", wl.options, q, k, v, w);
    const detail::BlockTable table(wl.options.layout);
    p.table = table.view();
    const auto check = [&] {
      const detail::Fingerprints f = detail::fingerprints(p, k.data, v.data);
      detail::check_saved_summaries_match("bench", p, f, wl.saved_summaries.data());
      detail::check_saved_mixed_match("bench", p, f, w.data, wl.saved_mixed.data());
    };
    const tools::TimingPolicy policy{5, 1.0, 30, true};
    constexpr int kRounds = 3;
    double checked = 0, unchecked = 0, alone = 0;
    for (int round = 0; round < kRounds; ++round) {
      checked += tools::median_seconds([&] { wl.mhla_backward_saved_arrays(); }, policy);
      unchecked += tools::median_seconds([&] { wl.mhla_backward_saved(); }, policy);
      alone += tools::median_seconds(check, policy);
    }
    checked /= kRounds, unchecked /= kRounds, alone /= kRounds;
    std::printf("%8lld %5lld %14.2f %14.2f %10.2f %7.1f%%\n", (long long)n, (long long)p.blocks,
                checked * 1e3, unchecked * 1e3, alone * 1e3, 100 * alone / unchecked);
    rows.push_back({{"tokens", n},
                    {"blocks", p.blocks},
                    {"backward_saved_checked_ms", checked * 1e3},
                    {"backward_saved_unchecked_ms", unchecked * 1e3},
                    {"check_ms", alone * 1e3},
                    {"check_share_of_unchecked_backward", alone / unchecked}});
  }
  if (!json_path.empty()) tools::write_json_file(json_path, {{"saved_state_check", rows}});
  return 0;
}
