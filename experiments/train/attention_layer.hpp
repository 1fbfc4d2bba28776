#pragma once
// Multi-head self-attention with a choice of mechanism: softmax, vanilla linear
// attention or MHLA, each computed by the library's operator (forward and
// backward). x -> [short conv] -> q, k, v projections -> [rotary positions]
// -> attention [+ positional convolution of v] -> [per-head RMSNorm * swish
// gate] -> output projection.
#include "mhla/forward_state.hpp"
#include "mhla/layout.hpp"
#include "mhla/mixing_init.hpp"
#include "mhla/options.hpp"
#include "train/grid_conv.hpp"
#include "train/linear.hpp"
#include "train/rms_norm.hpp"
#include "train/short_conv.hpp"

namespace mhla::train {

enum class AttentionKind { softmax, linear, mhla };
const char* to_string(AttentionKind kind);
AttentionKind parse_attention_kind(const std::string& name);  // mhla::Error listing the names

// How MHLA's mixing matrix W is learned.
enum class MixingParam {
  softmax,  // W = row softmax of free logits (masked to b <= i when causal): stochastic rows
  clamp,    // W itself, clamped into [1e-5, 1] after every optimiser step (the authors' language
            // models)
};
const char* to_string(MixingParam param);
MixingParam parse_mixing_param(const std::string& name);

// The design choices of the paper and of the authors' code, shared by every
// attention layer of a model. Options that are not MHLA's own (feature map,
// head, rotary, positional convolution) apply to linear attention and MHLA
// alike, so the two still differ only in the block mixing.
struct AttentionDesign {
  MixingParam mixing_param = MixingParam::softmax;
  bool mixing_shared = false;  // one W per layer instead of one per head
  double mixing_lr_scale = 1;  // the mixing parameters' learning rate / the others'
  MixingTransform mixing_init = MixingTransform::linear;  // W's start: locality (linear) or uniform
  FeatureMap feature_map = FeatureMap::elu1;
  // The authors' language-model head: linear attention and MHLA unnormalised
  // (scaled by Dk^-1/2), then for every kind a per-head RMSNorm and a swish
  // gate from the layer's input: o <- RMSNorm_head(o) * silu(x W_g).
  bool gated_head = false;
  bool rope = false;  // rotary position embeddings on q and k (token index order)
  int64_t value_conv =
      0;  // > 0: o += depthwise conv of v with this kernel (causal 1D, or k x k on 2D grids)
};

struct AttentionConfig {
  AttentionKind kind = AttentionKind::mhla;
  int64_t dim = 0, heads = 1;
  bool causal = false;
  TokenLayout layout;       // the token grid and, for MHLA, its blocks
  int64_t conv_kernel = 0;  // 0: no short convolution
  AttentionDesign design;
};

template <typename T>
class AttentionLayer {
 public:
  AttentionLayer() = default;
  AttentionLayer(const std::string& name, const AttentionConfig& config, Rng& rng);

  // x, y [batch, tokens, dim]; keeps what backward needs.
  void forward(const T* x, int64_t batch, T* y);
  // dx overwritten; adds every parameter gradient. x must be forward's input.
  void backward(const T* x, const T* dy, int64_t batch, T* dx);

  void collect(ParameterList<T>& out);
  // MHLA's mixing matrix as the operator receives it: [mixing_heads(), M, M],
  // non-negative; row-stochastic for MixingParam::softmax. Causal: 0 above the diagonal.
  std::vector<T> mixing() const;
  int64_t mixing_heads() const { return config.design.mixing_shared ? 1 : config.heads; }
  // The N x N attention matrix of one head for sample `sample` of the last
  // forward: o_t = sum_s A[t, s] v_s before the positional term and the head.
  std::vector<double> attention_matrix(int64_t sample, int64_t head) const;

  AttentionConfig config;
  ShortConv<T> conv;
  Linear<T> qkv, out, gate;
  Parameter<T> mixing_parameter;  // [mixing_heads(), M, M], MHLA only: logits or W itself
  ShortConv<T> value_conv_1d;     // causal sequences
  GridConv<T> value_conv_2d;      // non-causal grids
  RMSNorm<T> head_norm;           // gated head: over each head's Dv values

 private:
  Options operator_options() const;
  std::vector<int64_t> mixing_shape() const;  // W's shape for the operator: [M, M] when shared
  int64_t tokens() const { return config.layout.num_tokens(); }
  void value_term(const T* v, int64_t batch, T* out) const;
  void value_term_backward(const T* v, const T* grad, int64_t batch, T* grad_v);

  std::vector<T> conv_out_, qkv_, q_, k_, v_, o_, lse_, w_, position_, normed_, gate_pre_, mixed_;
  ForwardState<T> state_;  // what the operator's forward keeps for its backward
  std::vector<T> grad_o_, grad_q_, grad_k_, grad_v_, grad_w_, grad_qkv_, grad_conv_, grad_in_,
      grad_gate_, grad_normed_, grad_position_;
};

}  // namespace mhla::train
