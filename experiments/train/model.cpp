#include "train/model.hpp"

#include <algorithm>

#include "mhla/error.hpp"

namespace mhla::train {

template <typename T>
Block<T>::Block(const std::string& name, const ModelConfig& c, AttentionKind kind, Rng& rng)
    : norm1(name + ".norm1", c.dim),
      norm2(name + ".norm2", c.dim),
      attention(name + ".attention",
                AttentionConfig{kind, c.dim, c.heads, c.causal, c.layout, c.conv_kernel, c.design},
                rng),
      mlp(name + ".mlp", c.dim, c.mlp_hidden, rng),
      tokens_(c.layout.num_tokens()),
      dim_(c.dim) {}

template <typename T>
void Block<T>::collect(ParameterList<T>& out) {
  norm1.collect(out);
  attention.collect(out);
  norm2.collect(out);
  mlp.collect(out);
}

template <typename T>
void Block<T>::forward(const T* x, int64_t batch, T* y) {
  const int64_t rows = batch * tokens_, n = rows * dim_;
  for (auto* b : {&normed1_, &middle_, &normed2_, &scratch_}) b->resize(size_t(n));
  norm1.forward(x, rows, normed1_.data());
  attention.forward(normed1_.data(), batch, scratch_.data());
  for (int64_t i = 0; i < n; ++i) middle_[size_t(i)] = x[i] + scratch_[size_t(i)];
  norm2.forward(middle_.data(), rows, normed2_.data());
  mlp.forward(normed2_.data(), rows, scratch_.data());
  for (int64_t i = 0; i < n; ++i) y[i] = middle_[size_t(i)] + scratch_[size_t(i)];
}

template <typename T>
void Block<T>::backward(const T* x, const T* dy, int64_t batch, T* dx) {
  const int64_t rows = batch * tokens_, n = rows * dim_;
  for (auto* b : {&grad_scratch_, &grad_middle_}) b->resize(size_t(n));
  mlp.backward(normed2_.data(), dy, rows, scratch_.data());
  norm2.backward(middle_.data(), scratch_.data(), rows, grad_scratch_.data());
  for (int64_t i = 0; i < n; ++i) grad_middle_[size_t(i)] = dy[i] + grad_scratch_[size_t(i)];
  attention.backward(normed1_.data(), grad_middle_.data(), batch, scratch_.data());
  norm1.backward(x, scratch_.data(), rows, grad_scratch_.data());
  for (int64_t i = 0; i < n; ++i) dx[i] = grad_middle_[size_t(i)] + grad_scratch_[size_t(i)];
}

template <typename T>
Model<T>::Model(const ModelConfig& c, uint64_t seed) : config_(c), tokens_(c.layout.num_tokens()) {
  if ((c.vocab > 0) == (c.patch_dim > 0))
    throw Error("model: exactly one of vocab and patch_dim must be set");
  if (c.attention.empty()) throw Error("model: at least one layer is needed");
  if (c.classes <= 0 || c.dim <= 0 || c.mlp_hidden <= 0)
    throw Error("model: classes, dim and mlp_hidden must be positive");
  Rng rng(seed);
  if (c.vocab > 0) {
    token_embedding_ = TokenEmbedding<T>("embed", c.vocab, c.dim, rng);
    token_embedding_.collect(parameters_);
  } else {
    patch_embedding_ = Linear<T>("embed", c.patch_dim, c.dim, true, rng);
    patch_embedding_.collect(parameters_);
  }
  positions_ = PositionEmbedding<T>("positions", tokens_, c.dim, rng);
  positions_.collect(parameters_);
  for (size_t l = 0; l < c.attention.size(); ++l) {
    blocks_.push_back(
        std::make_unique<Block<T>>("block" + std::to_string(l), c, c.attention[l], rng));
    blocks_.back()->collect(parameters_);
  }
  final_norm_ = RMSNorm<T>("final_norm", c.dim);
  final_norm_.collect(parameters_);
  head_ = Linear<T>("head", c.dim, c.classes, true, rng);
  head_.collect(parameters_);
  activations_.resize(blocks_.size() + 1);
}

template <typename T>
void Model<T>::zero_grad() {
  for (Parameter<T>* p : parameters_) std::fill(p->grad.begin(), p->grad.end(), T(0));
}

template <typename T>
int64_t Model<T>::parameter_count() const {
  int64_t n = 0;
  for (const Parameter<T>* p : parameters_) n += p->size();
  return n;
}

template <typename T>
const std::vector<T>& Model<T>::forward(const ModelInput<T>& input, int64_t batch) {
  const int64_t rows = batch * tokens_, d = config_.dim;
  for (auto& a : activations_) a.resize(size_t(rows * d));
  if (config_.vocab > 0)
    token_embedding_.forward(input.tokens, rows, activations_[0].data());
  else
    patch_embedding_.forward(input.patches, rows, activations_[0].data());
  positions_.add_to(activations_[0].data(), batch);
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l]->forward(activations_[l].data(), batch, activations_[l + 1].data());
  normed_.resize(size_t(rows * d));
  final_norm_.forward(activations_.back().data(), rows, normed_.data());
  if (config_.pool) {
    pooled_.assign(size_t(batch * d), T(0));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < tokens_; ++t)
        for (int64_t j = 0; j < d; ++j)
          pooled_[size_t(b * d + j)] += normed_[size_t((b * tokens_ + t) * d + j)];
    for (T& e : pooled_) e /= T(tokens_);
    logits_.resize(size_t(batch * config_.classes));
    head_.forward(pooled_.data(), batch, logits_.data());
  } else {
    logits_.resize(size_t(rows * config_.classes));
    head_.forward(normed_.data(), rows, logits_.data());
  }
  return logits_;
}

template <typename T>
void Model<T>::backward(const ModelInput<T>& input, const T* grad_logits, int64_t batch) {
  const int64_t rows = batch * tokens_, d = config_.dim;
  grad_a_.resize(size_t(rows * d));
  grad_b_.resize(size_t(rows * d));
  if (config_.pool) {
    grad_head_in_.resize(size_t(batch * d));
    head_.backward(pooled_.data(), grad_logits, batch, grad_head_in_.data());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < tokens_; ++t)
        for (int64_t j = 0; j < d; ++j)
          grad_a_[size_t((b * tokens_ + t) * d + j)] =
              grad_head_in_[size_t(b * d + j)] / T(tokens_);
  } else {
    head_.backward(normed_.data(), grad_logits, rows, grad_a_.data());
  }
  final_norm_.backward(activations_.back().data(), grad_a_.data(), rows, grad_b_.data());
  for (size_t l = blocks_.size(); l-- > 0;) {
    blocks_[l]->backward(activations_[l].data(), grad_b_.data(), batch, grad_a_.data());
    std::swap(grad_a_, grad_b_);
  }
  positions_.backward(grad_b_.data(), batch);
  if (config_.vocab > 0)
    token_embedding_.backward(input.tokens, grad_b_.data(), rows);
  else
    patch_embedding_.backward(input.patches, grad_b_.data(), rows, nullptr);
}

template class Block<float>;
template class Block<double>;
template class Model<float>;
template class Model<double>;

}  // namespace mhla::train
