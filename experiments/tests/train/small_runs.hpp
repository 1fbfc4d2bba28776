#pragma once
// A training run small enough for unit tests: MQAR with 4 pairs in 32 tokens,
// width 16, 12 steps of 4 sequences.
#include "train/run_config.hpp"

namespace mhla::train::test {

inline RunConfig small_mqar(const std::vector<AttentionKind>& attention) {
  RunConfig c;
  c.task = TaskKind::mqar;
  c.attention = attention;
  c.dim = 16;
  c.heads = 2;
  c.mlp_hidden = 32;
  c.conv_kernel = 3;
  c.steps = 12;
  c.batch = 4;
  c.warmup = 2;
  c.vocab = 32;
  c.seq_len = 32;
  c.kv_pairs = 4;
  c.block = 8;
  c.eval_samples = 8;
  c.seed = 5;
  return c;
}

}  // namespace mhla::train::test
