// Streaming-decoder benchmark: tokens/s at positions 1k, 8k and 64k, the
// speed-up over a naive decoder that recomputes the whole block mix
// sum_{b<i} W[i,b] S_b at every token (at 32k, with the same W as a dense
// matrix), and the decoder state's bytes next to a softmax KV cache's at the
// same position.
//
//   mhla_decode_bench [--block C] [--mixing dense|toeplitz] [--length L]
//                     [--batch B] [--json results.json] [--quick]
//
// With --batch B the decoder holds B sequences at the same position and each
// step decodes one token of every one; tokens/s then counts all B.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "common/json_file.hpp"
#include "common/timing.hpp"
#include "mhla/mhla.hpp"

using nlohmann::json;

namespace {

constexpr int64_t kHeads = 8, kDim = 64;

struct Tokens {
  std::vector<float> q, k, v;
  Tokens(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto* x : {&q, &k, &v}) {
      x->resize(size_t(n * kHeads * kDim));
      for (float& e : *x) e = dist(rng);
    }
  }
};

// Prefills `position` tokens into every sequence of the decoder, then times
// `steps` steps of one token per sequence (block starts included); the median
// of three such runs, in seconds per step. With B > 1 every sequence gets the
// same prompt and the steps read `batched`, [steps, B, H, D].
double seconds_per_step(mhla::Decoder& dec, const Tokens& data, const Tokens* batched,
                        int64_t position, int64_t steps) {
  const int64_t batch = dec.options().batch;
  const std::vector<int64_t> ps = {1, position, kHeads, kDim};
  std::vector<float> prompt_out(size_t(position * kHeads * kDim));
  const std::vector<int64_t> ts = {batch, 1, kHeads, kDim};
  std::vector<float> o(size_t(batch * kHeads * kDim));
  const int64_t row = kHeads * kDim;
  std::vector<double> runs;
  for (int run = 0; run < 3; ++run) {
    for (int64_t s = 0; s < batch; ++s) {
      dec.reset(s);
      dec.prefill(s, {data.q.data(), ps}, {data.k.data(), ps}, {data.v.data(), ps},
                  {prompt_out.data(), ps});
    }
    runs.push_back(mhla::tools::median_seconds(
        [&] {
          for (int64_t t = 0; t < steps; ++t) {
            const Tokens& from = batched ? *batched : data;
            const int64_t at = (batched ? t * batch : position + t) * row;
            dec.step({from.q.data() + at, ts}, {from.k.data() + at, ts}, {from.v.data() + at, ts},
                     {o.data(), ts});
          }
        },
        {1, 0.0, 1, false}));
  }
  std::sort(runs.begin(), runs.end());
  return runs[1] / double(steps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MHLA streaming decoder benchmark (CPU, fp32, H=8 D=64)"};
  int64_t block = 256;
  bool quick = false;
  std::string json_path, mixing = "dense";
  int64_t length = 16, batch = 1;
  app.add_option("--block", block, "tokens per block C (default 256: M^2 <= N up to 64k tokens)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--mixing", mixing, "dense (learnt M x M W) or toeplitz (w[min(i - b, L)])")
      ->check(CLI::IsMember({"dense", "toeplitz"}));
  app.add_option("--length", length, "Toeplitz: stored distances L (the tail covers the rest)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_option("--batch", batch, "sequences decoded together, one token each per step")
      ->check(CLI::Range(int64_t(1), int64_t(256)));
  app.add_flag("--quick", quick, "positions 256/1k/4k instead of 1k/8k/64k (smoke test)");
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  const std::vector<int64_t> positions =
      quick ? std::vector<int64_t>{256, 1024, 4096} : std::vector<int64_t>{1024, 8192, 65536};
  const int64_t steps = quick ? 64 : 512, naive_steps = quick ? 16 : 64;
  const int64_t naive_position = quick ? 2048 : 32768;
  const int64_t max_tokens = positions.back() + steps;
  const int64_t m = (max_tokens + block - 1) / block;
  // Locality-biased weights: the causal linear init for a dense W, an
  // exponential decay over L + 1 distances (sigma L/4) for Toeplitz.
  const bool toeplitz = mixing == "toeplitz";
  mhla::MixingInit init;
  init.causal = true;
  std::vector<float> w;
  std::vector<int64_t> w_shape;
  std::vector<float> dense_w;  // the same W as an M x M matrix, for the naive decoder
  if (toeplitz) {
    init.transform = mhla::MixingTransform::exp;
    init.sigma = std::max(1.0, double(length) / 4);
    w = mhla::init_toeplitz_mixing(length, init);
    w_shape = {length + 1};
    dense_w = mhla::toeplitz_to_dense({w.data(), w_shape}, m);
  } else {
    w = mhla::init_mixing(mhla::TokenLayout::sequence(m * block, block), init);
    w_shape = {m, m};
    dense_w = w;
  }
  mhla::DecoderOptions options;
  options.heads = kHeads;
  options.dk = kDim;
  options.dv = kDim;
  options.block = block;
  options.mixing = toeplitz ? mhla::MixingForm::toeplitz : mhla::MixingForm::dense;
  options.batch = batch;
  mhla::Decoder dec(options, {w.data(), w_shape});
  const Tokens data(max_tokens, 11);
  std::optional<Tokens> batched;
  if (batch > 1) batched.emplace(steps * batch, 12);

  json results = {{"block", block}, {"batch", batch}, {"heads", kHeads},
                  {"dim", kDim},    {"steps", steps}, {"mixing", mixing}};
  if (toeplitz) results["toeplitz_length"] = length;
  std::printf("streaming decoder, B=%lld H=%lld D=%lld, block C=%lld, elu+1, normalized, %s mixing",
              (long long)batch, (long long)kHeads, (long long)kDim, (long long)block,
              mixing.c_str());
  if (toeplitz) std::printf(" (L=%lld)", (long long)length);
  std::printf("\n");
  std::printf("%10s %12s %14s %16s %10s\n", "position", "tokens/s", "state bytes", "KV-cache bytes",
              "state/KV");
  double first_rate = 0, last_rate = 0;
  for (int64_t p : positions) {
    // Tokens of all sequences per second.
    const double rate =
        double(batch) / seconds_per_step(dec, data, batched ? &*batched : nullptr, p, steps);
    const int64_t at = p + steps;
    const double kv = double(batch) * double(at) * kHeads * 2 * kDim * sizeof(float);
    std::printf("%10lld %12.0f %14lld %16.0f %10.3f\n", (long long)p, rate,
                (long long)dec.state_bytes(), kv, double(dec.state_bytes()) / kv);
    results["positions"].push_back({{"position", p},
                                    {"tokens_per_second", rate},
                                    {"state_bytes", dec.state_bytes()},
                                    {"softmax_kv_cache_bytes", kv}});
    if (first_rate == 0) first_rate = rate;
    last_rate = rate;
  }
  std::printf("rate at %lld / rate at %lld: %.2f\n", (long long)positions.back(),
              (long long)positions.front(), last_rate / first_rate);
  results["last_over_first_rate"] = last_rate / first_rate;

  // The naive decoder's comparison, on one sequence.
  options.recompute_mix_every_token = true;
  options.mixing = mhla::MixingForm::dense;
  options.batch = 1;
  mhla::Decoder naive(options, {dense_w.data(), {m, m}});
  options.recompute_mix_every_token = false;
  options.mixing = toeplitz ? mhla::MixingForm::toeplitz : mhla::MixingForm::dense;
  mhla::Decoder single(options, {w.data(), w_shape});
  const double fast = seconds_per_step(single, data, nullptr, naive_position, steps);
  const double slow = seconds_per_step(naive, data, nullptr, naive_position, naive_steps);
  std::printf(
      "at position %lld: %.1f us/token; recomputing the mix over all finished blocks "
      "every token: %.1f us/token; speed-up %.1fx\n",
      (long long)naive_position, fast * 1e6, slow * 1e6, slow / fast);
  results["speedup_over_recompute"] = {{"position", naive_position},
                                       {"seconds_per_token", fast},
                                       {"recompute_seconds_per_token", slow},
                                       {"speedup", slow / fast}};
  if (!json_path.empty() && !mhla::tools::write_json_file(json_path, results)) return 1;
  return 0;
}
