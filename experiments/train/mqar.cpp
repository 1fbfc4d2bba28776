#include "train/mqar.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mhla/error.hpp"

namespace mhla::train {

void check_mqar_config(const MqarConfig& c) {
  if (c.kv_pairs <= 0) throw Error("mqar: kv_pairs must be positive");
  if (c.vocab / 2 - 1 < c.kv_pairs)
    throw Error("mqar: " + std::to_string(c.kv_pairs) +
                " distinct keys need a vocabulary of at least " +
                std::to_string(2 * c.kv_pairs + 2) + " (got " + std::to_string(c.vocab) + ")");
  if (c.seq_len < 4 * c.kv_pairs)
    throw Error("mqar: " + std::to_string(c.kv_pairs) +
                " pairs and their queries need seq_len >= " + std::to_string(4 * c.kv_pairs) +
                " (got " + std::to_string(c.seq_len) + ")");
}

Batch make_mqar_batch(const MqarConfig& c, int64_t size, uint64_t seed) {
  check_mqar_config(c);
  Rng rng(seed);
  const int64_t n = c.seq_len, context = 2 * c.kv_pairs, key_vocab = c.vocab / 2;
  // Query slot g (0-based) sits at context + 2 g; its weight follows the power law.
  const int64_t slots = (n - context) / 2;
  std::vector<double> slot_weight(static_cast<size_t>(slots));
  for (int64_t g = 0; g < slots; ++g)
    slot_weight[size_t(g)] = c.power_a * std::pow(double(g + 1), c.power_a - 1);

  Batch batch;
  batch.size = size;
  batch.tokens.assign(size_t(size * n), 0);
  batch.targets.assign(size_t(size * n), -1);
  std::vector<int32_t> keys(size_t(key_vocab - 1)), values(size_t(c.vocab - key_vocab));
  std::uniform_int_distribution<int32_t> any_token(0, int32_t(c.vocab - 1));
  for (int64_t s = 0; s < size; ++s) {
    int32_t* tokens = batch.tokens.data() + s * n;
    int32_t* targets = batch.targets.data() + s * n;
    std::iota(keys.begin(), keys.end(), 1);
    std::iota(values.begin(), values.end(), int32_t(key_vocab));
    std::shuffle(keys.begin(), keys.end(), rng);
    std::shuffle(values.begin(), values.end(), rng);
    for (int64_t i = 0; i < n; ++i) tokens[i] = any_token(rng);
    for (int64_t p = 0; p < c.kv_pairs; ++p) {
      tokens[2 * p] = keys[size_t(p)];
      tokens[2 * p + 1] = values[size_t(p)];
    }
    // Distinct slots, drawn one by one in proportion to the remaining weights.
    std::vector<double> weight = slot_weight;
    for (int64_t p = 0; p < c.kv_pairs; ++p) {
      std::discrete_distribution<int64_t> pick(weight.begin(), weight.end());
      const int64_t g = pick(rng);
      weight[size_t(g)] = 0;
      const int64_t position = context + 2 * g;
      tokens[position] = keys[size_t(p)];
      targets[position] = values[size_t(p)];
    }
  }
  return batch;
}

}  // namespace mhla::train
