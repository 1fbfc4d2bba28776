#pragma once
// A small pre-norm Transformer: embedding + learned positions, L blocks of
// x += Attention(RMSNorm(x)); x += MLP(RMSNorm(x)), a final RMSNorm and a linear
// head. Two front ends share it: token ids (causal language model, one
// prediction per token) and image patches (ViT, mean-pooled to one prediction).
#include <memory>

#include "train/attention_layer.hpp"
#include "train/embedding.hpp"
#include "train/mlp.hpp"
#include "train/rms_norm.hpp"

namespace mhla::train {

struct ModelConfig {
  int64_t vocab = 0;      // > 0: the input is token ids in [0, vocab)
  int64_t patch_dim = 0;  // > 0: the input is one vector of patch_dim values per token
  int64_t classes = 0;    // width of the head's output
  bool pool = false;      // mean over tokens before the head (one prediction per sample)
  bool causal = false;
  TokenLayout layout;  // the token grid; MHLA's blocks are its tiles
  int64_t dim = 64, heads = 2, mlp_hidden = 256, conv_kernel = 0;
  AttentionDesign design;                // every attention layer's options
  std::vector<AttentionKind> attention;  // one per layer
};

template <typename T>
struct ModelInput {
  const int32_t* tokens = nullptr;  // [batch, tokens] when vocab > 0
  const T* patches = nullptr;       // [batch, tokens, patch_dim] when patch_dim > 0
};

template <typename T>
class Block {
 public:
  Block(const std::string& name, const ModelConfig& c, AttentionKind kind, Rng& rng);
  void forward(const T* x, int64_t batch, T* y);
  void backward(const T* x, const T* dy, int64_t batch, T* dx);
  void collect(ParameterList<T>& out);

  RMSNorm<T> norm1, norm2;
  AttentionLayer<T> attention;
  MLP<T> mlp;

 private:
  int64_t tokens_, dim_;
  std::vector<T> normed1_, middle_, normed2_, scratch_, grad_scratch_, grad_middle_;
};

template <typename T>
class Model {
 public:
  explicit Model(const ModelConfig& config, uint64_t seed);

  // Returns the logits: [batch, classes] when pooling, else [batch * tokens, classes].
  const std::vector<T>& forward(const ModelInput<T>& input, int64_t batch);
  // Adds the gradient of the loss given dL/dlogits (forward must have run on the same input).
  void backward(const ModelInput<T>& input, const T* grad_logits, int64_t batch);

  const ParameterList<T>& parameters() const { return parameters_; }
  void zero_grad();
  int64_t parameter_count() const;
  const ModelConfig& config() const { return config_; }
  // The layers, for diagnostics of a trained model (attention matrices, W).
  const std::vector<std::unique_ptr<Block<T>>>& blocks() const { return blocks_; }

 private:
  ModelConfig config_;
  int64_t tokens_;
  TokenEmbedding<T> token_embedding_;
  Linear<T> patch_embedding_;
  PositionEmbedding<T> positions_;
  std::vector<std::unique_ptr<Block<T>>> blocks_;
  RMSNorm<T> final_norm_;
  Linear<T> head_;
  ParameterList<T> parameters_;
  std::vector<std::vector<T>> activations_;  // input of block l; [L] is the last output
  std::vector<T> normed_, pooled_, logits_, grad_a_, grad_b_, grad_head_in_;
};

}  // namespace mhla::train
