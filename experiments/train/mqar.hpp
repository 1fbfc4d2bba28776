#pragma once
// Multi-query associative recall (MQAR), as defined by the Zoology benchmark
// (Arora et al., 2023): a sequence opens with kv_pairs key-value pairs
// k1 v1 k2 v2 ...; later, each key appears once more as a query, and the model
// must predict its paired value at the query's position. Keys come from the
// lower half of the vocabulary and values from the upper half; query positions
// follow Zoology's power law (queries cluster near the context, alpha = 0.01);
// every other position holds a random token. Only query positions are labelled.
#include "train/batch.hpp"

namespace mhla::train {

struct MqarConfig {
  int64_t vocab = 256, seq_len = 256, kv_pairs = 16;
  double power_a = 0.01;
};

// Throws mhla::Error when the pairs do not fit the sequence or the vocabulary.
void check_mqar_config(const MqarConfig& config);

// `size` sequences drawn from `seed` alone: tokens and targets [size, seq_len].
Batch make_mqar_batch(const MqarConfig& config, int64_t size, uint64_t seed);

}  // namespace mhla::train
