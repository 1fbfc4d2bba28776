#include "common/workload.hpp"

#include <cmath>
#include <random>

namespace mhla::tools {

Workload::Workload(int64_t batch_, int64_t tokens_, int64_t heads_, int64_t dim_, int64_t blocks,
                   Masking masking, uint64_t seed)
    : batch(batch_), tokens(tokens_), heads(heads_), dim(dim_) {
  const int64_t block = (tokens + blocks - 1) / blocks;
  options.layout = TokenLayout::sequence(tokens, block);
  options.masking = masking;
  options.feature_map = FeatureMap::elu1;
  const size_t n = size_t(batch * tokens * heads * dim);
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* x : {&q, &k, &v, &grad_o}) {
    x->resize(n);
    for (float& e : *x) e = normal(rng);
  }
  MixingInit init;
  init.causal = masking == Masking::causal;
  w = init_mixing(options.layout, init);
  o.resize(n);
  grad_q.resize(n);
  grad_k.resize(n);
  grad_v.resize(n);
  grad_w.resize(w.size());
  lse.resize(size_t(batch * heads * tokens));
}

std::vector<int64_t> Workload::w_shape() const {
  const int64_t m = options.layout.num_blocks();
  return {m, m};
}

double Workload::tensor_bytes() const {
  // q, k, v, grad_o in; o, grad_q, grad_k, grad_v out; w and grad_w.
  return double(8 * q.size() + 2 * w.size()) * sizeof(float);
}

void Workload::mhla_forward() {
  forward<float>(options, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()},
                 {w.data(), w_shape()}, {o.data(), shape()});
}

void Workload::mhla_backward() {
  backward<float>(options, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()},
                  {w.data(), w_shape()}, {o.data(), shape()}, {grad_o.data(), shape()},
                  {grad_q.data(), shape()}, {grad_k.data(), shape()}, {grad_v.data(), shape()},
                  {grad_w.data(), w_shape()});
}

void Workload::mhla_forward_saving() {
  forward<float>(options, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()},
                 {w.data(), w_shape()}, {o.data(), shape()}, state);
}

void Workload::mhla_backward_saved() {
  backward<float>(options, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()},
                  {w.data(), w_shape()}, {o.data(), shape()}, {grad_o.data(), shape()},
                  {grad_q.data(), shape()}, {grad_k.data(), shape()}, {grad_v.data(), shape()},
                  {grad_w.data(), w_shape()}, state);
}

namespace {

// x rounded to bfloat16 into out, once (a Workload's inputs never change).
void round_once(const Workload::Tensor& x, Workload::Bf16Tensor& out) {
  if (out.size() == x.size()) return;
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_bfloat16(x[i]);
}

}  // namespace

void Workload::bf16_forward() {
  round_once(q, bq), round_once(k, bk), round_once(v, bv);
  bo.resize(o.size());
  forward<bfloat16>(options, {bq.data(), shape()}, {bk.data(), shape()}, {bv.data(), shape()},
                    {w.data(), w_shape()}, {bo.data(), shape()});
}

void Workload::bf16_forward_saving() {
  round_once(q, bq), round_once(k, bk), round_once(v, bv);
  bo.resize(o.size());
  forward<bfloat16>(options, {bq.data(), shape()}, {bk.data(), shape()}, {bv.data(), shape()},
                    {w.data(), w_shape()}, {bo.data(), shape()}, bf16_state);
}

void Workload::bf16_backward_saved() {
  round_once(grad_o, bgrad_o);
  bgrad_q.resize(q.size()), bgrad_k.resize(k.size()), bgrad_v.resize(v.size());
  backward<bfloat16>(options, {bq.data(), shape()}, {bk.data(), shape()}, {bv.data(), shape()},
                     {w.data(), w_shape()}, {bo.data(), shape()}, {bgrad_o.data(), shape()},
                     {bgrad_q.data(), shape()}, {bgrad_k.data(), shape()},
                     {bgrad_v.data(), shape()}, {grad_w.data(), w_shape()}, bf16_state);
}

void Workload::linear_forward() {
  linear_attention_forward<float>(options, {q.data(), shape()}, {k.data(), shape()},
                                  {v.data(), shape()}, {o.data(), shape()});
}

void Workload::linear_backward() {
  linear_attention_backward<float>(options, {q.data(), shape()}, {k.data(), shape()},
                                   {v.data(), shape()}, {o.data(), shape()},
                                   {grad_o.data(), shape()}, {grad_q.data(), shape()},
                                   {grad_k.data(), shape()}, {grad_v.data(), shape()});
}

void Workload::softmax_forward() {
  SoftmaxOptions s;
  s.causal = options.masking == Masking::causal;
  softmax_attention_forward<float>(s, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()},
                                   {o.data(), shape()}, {lse.data(), {batch, heads, tokens}});
}

void Workload::softmax_backward() {
  SoftmaxOptions s;
  s.causal = options.masking == Masking::causal;
  softmax_attention_backward<float>(
      s, {q.data(), shape()}, {k.data(), shape()}, {v.data(), shape()}, {o.data(), shape()},
      {lse.data(), {batch, heads, tokens}}, {grad_o.data(), shape()}, {grad_q.data(), shape()},
      {grad_k.data(), shape()}, {grad_v.data(), shape()});
}

int64_t blocks_for(int64_t tokens) {
  return std::max<int64_t>(1, std::llround(std::sqrt(double(tokens))));
}

}  // namespace mhla::tools
