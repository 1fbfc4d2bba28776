#include "train/attention_layer.hpp"

#include <algorithm>
#include <cmath>

#include "mhla/baselines.hpp"
#include "mhla/error.hpp"
#include "mhla/operator.hpp"
#include "mhla/reference.hpp"
#include "mhla_support/parse_enum.hpp"
#include "train/rotary.hpp"

namespace mhla::train {

const char* to_string(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::softmax:
      return "softmax";
    case AttentionKind::linear:
      return "linear";
    case AttentionKind::mhla:
      return "mhla";
  }
  return "?";
}

AttentionKind parse_attention_kind(const std::string& name) {
  return detail::parse_enum(name, "attention",
                            {AttentionKind::softmax, AttentionKind::linear, AttentionKind::mhla});
}

const char* to_string(MixingParam param) {
  switch (param) {
    case MixingParam::softmax:
      return "softmax";
    case MixingParam::clamp:
      return "clamp";
  }
  return "?";
}

MixingParam parse_mixing_param(const std::string& name) {
  return detail::parse_enum(name, "mixing parametrisation",
                            {MixingParam::softmax, MixingParam::clamp});
}

namespace {

// The authors' bounds for a directly learned W.
constexpr double kClampLow = 1e-5, kClampHigh = 1.0;
// Logits start at log(W0); zeros are floored here so every entry can still learn.
constexpr double kLogitFloor = 1e-4;

template <typename T>
T sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

}  // namespace

template <typename T>
AttentionLayer<T>::AttentionLayer(const std::string& name, const AttentionConfig& c, Rng& rng)
    : config(c),
      qkv(name + ".qkv", c.dim, 3 * c.dim, false, rng),
      out(name + ".out", c.dim, c.dim, true, rng) {
  if (c.heads <= 0 || c.dim % c.heads != 0)
    throw Error(name + ": dim " + std::to_string(c.dim) + " is not divisible by heads " +
                std::to_string(c.heads));
  const AttentionDesign& d = c.design;
  if (d.rope && (c.dim / c.heads) % 2 != 0)
    throw Error(name + ": rotary positions need an even head dimension, got " +
                std::to_string(c.dim / c.heads));
  if (!(d.mixing_lr_scale > 0)) throw Error(name + ": the mixing learning-rate scale must be > 0");
  if (c.conv_kernel > 0) conv = ShortConv<T>(name + ".conv", c.dim, c.conv_kernel, rng);
  if (c.kind == AttentionKind::mhla) {
    const int64_t m = c.layout.num_blocks(), heads = mixing_heads();
    MixingInit init;
    init.transform = d.mixing_init;
    init.causal = c.causal;
    const std::vector<float> w0 = init_mixing(c.layout, init);
    const bool logits = d.mixing_param == MixingParam::softmax;
    mixing_parameter = Parameter<T>(name + (logits ? ".mixing_logits" : ".mixing"), {heads, m, m},
                                    /*decay=*/false);
    mixing_parameter.lr_scale = d.mixing_lr_scale;
    if (!logits) {
      mixing_parameter.lower = kClampLow;
      mixing_parameter.upper = kClampHigh;
    }
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < m * m; ++i) {
        const double w = double(w0[size_t(i)]);
        mixing_parameter.value[size_t(h * m * m + i)] =
            T(logits ? std::log(std::max(w, kLogitFloor)) : std::clamp(w, kClampLow, kClampHigh));
      }
  }
  if (d.value_conv > 0) {
    const auto& grid = c.layout.grid();
    if (c.causal) {
      if (grid[0] != 1 || grid[1] != 1)
        throw Error(name + ": a causal positional convolution needs a 1D sequence");
      value_conv_1d = ShortConv<T>(name + ".value_conv", c.dim, d.value_conv, rng);
    } else {
      if (grid[0] != 1)
        throw Error(name + ": the positional convolution supports 1D and 2D layouts, not 3D");
      value_conv_2d = GridConv<T>(name + ".value_conv", c.dim, d.value_conv, rng);
    }
  }
  if (d.gated_head) {
    gate = Linear<T>(name + ".gate", c.dim, c.dim, true, rng);
    head_norm = RMSNorm<T>(name + ".head_norm", c.dim / c.heads);
  }
}

template <typename T>
void AttentionLayer<T>::collect(ParameterList<T>& list) {
  if (config.conv_kernel > 0) conv.collect(list);
  qkv.collect(list);
  out.collect(list);
  if (config.kind == AttentionKind::mhla) list.push_back(&mixing_parameter);
  if (config.design.value_conv > 0) {
    if (config.causal)
      value_conv_1d.collect(list);
    else
      value_conv_2d.collect(list);
  }
  if (config.design.gated_head) {
    gate.collect(list);
    head_norm.collect(list);
  }
}

template <typename T>
Options AttentionLayer<T>::operator_options() const {
  Options o;
  o.layout = config.layout;
  o.masking = config.causal ? Masking::causal : Masking::none;
  o.feature_map = config.design.feature_map;
  o.normalize = !config.design.gated_head;  // unnormalised: scaled by Dk^-1/2 (the default scale)
  return o;
}

template <typename T>
std::vector<int64_t> AttentionLayer<T>::mixing_shape() const {
  const int64_t m = config.layout.num_blocks();
  return config.design.mixing_shared ? std::vector<int64_t>{m, m}
                                     : std::vector<int64_t>{config.heads, m, m};
}

template <typename T>
std::vector<T> AttentionLayer<T>::mixing() const {
  const int64_t m = config.layout.num_blocks();
  const bool logits = config.design.mixing_param == MixingParam::softmax;
  std::vector<T> w(size_t(mixing_heads() * m * m), T(0));
  for (int64_t r = 0; r < mixing_heads() * m; ++r) {
    const int64_t cols = config.causal ? r % m + 1 : m;
    const T* p = mixing_parameter.value.data() + r * m;
    T* wr = w.data() + r * m;
    if (!logits) {
      std::copy(p, p + cols, wr);
      continue;
    }
    const T top = *std::max_element(p, p + cols);
    double sum = 0;
    for (int64_t b = 0; b < cols; ++b) sum += std::exp(double(p[b] - top));
    for (int64_t b = 0; b < cols; ++b) wr[b] = T(std::exp(double(p[b] - top)) / sum);
  }
  return w;
}

template <typename T>
void AttentionLayer<T>::value_term(const T* v, int64_t batch, T* result) const {
  const auto& grid = config.layout.grid();
  if (config.causal)
    value_conv_1d.forward(v, batch, tokens(), result);
  else
    value_conv_2d.forward(v, batch, grid[1], grid[2], result);
}

template <typename T>
void AttentionLayer<T>::value_term_backward(const T* v, const T* grad, int64_t batch, T* grad_v) {
  const auto& grid = config.layout.grid();
  const int64_t n = batch * tokens() * config.dim;
  grad_position_.resize(size_t(n));
  if (config.causal)
    value_conv_1d.backward(v, grad, batch, tokens(), grad_position_.data());
  else
    value_conv_2d.backward(v, grad, batch, grid[1], grid[2], grad_position_.data());
  for (int64_t i = 0; i < n; ++i) grad_v[i] += grad_position_[size_t(i)];
}

template <typename T>
void AttentionLayer<T>::forward(const T* x, int64_t batch, T* y) {
  const int64_t n = tokens(), d = config.dim, h = config.heads, dh = d / h, rows = batch * n;
  const AttentionDesign& design = config.design;
  const std::vector<int64_t> shape{batch, n, h, dh};
  const T* input = x;
  if (config.conv_kernel > 0) {
    conv_out_.resize(size_t(rows * d));
    conv.forward(x, batch, n, conv_out_.data());
    input = conv_out_.data();
  }
  qkv_.resize(size_t(rows * 3 * d));
  qkv.forward(input, rows, qkv_.data());
  for (auto* buffer : {&q_, &k_, &v_, &o_}) buffer->resize(size_t(rows * d));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = qkv_.data() + r * 3 * d;
    std::copy(src, src + d, q_.data() + r * d);
    std::copy(src + d, src + 2 * d, k_.data() + r * d);
    std::copy(src + 2 * d, src + 3 * d, v_.data() + r * d);
  }
  if (design.rope) {
    rotate_positions(q_.data(), batch, n, h, dh, false);
    rotate_positions(k_.data(), batch, n, h, dh, false);
  }
  TensorView<const T> q{q_.data(), shape}, k{k_.data(), shape}, v{v_.data(), shape};
  TensorView<T> o{o_.data(), shape};
  switch (config.kind) {
    case AttentionKind::softmax: {
      lse_.resize(size_t(batch * h * n));
      softmax_attention_forward<T>({config.causal, {}}, q, k, v, o, {lse_.data(), {batch, h, n}});
      break;
    }
    case AttentionKind::linear:
      linear_attention_forward<T>(operator_options(), q, k, v, o);
      break;
    case AttentionKind::mhla: {
      const Options options = operator_options();
      w_ = mixing();
      mhla::forward<T>(options, q, k, v, TensorView<const T>{w_.data(), mixing_shape()}, o,
                       state_);
      break;
    }
  }
  // o_ stays the operator's output (its backward reads it); the extras go to copies.
  const T* attended = o_.data();
  if (design.value_conv > 0) {
    position_.resize(size_t(rows * d));
    value_term(v_.data(), batch, position_.data());
    for (int64_t i = 0; i < rows * d; ++i) position_[size_t(i)] += o_[size_t(i)];
    attended = position_.data();
  }
  if (design.gated_head) {
    normed_.resize(size_t(rows * d));
    gate_pre_.resize(size_t(rows * d));
    mixed_.resize(size_t(rows * d));
    head_norm.forward(attended, rows * h, normed_.data());
    gate.forward(input, rows, gate_pre_.data());
    for (int64_t i = 0; i < rows * d; ++i)
      mixed_[size_t(i)] = normed_[size_t(i)] * gate_pre_[size_t(i)] * sigmoid(gate_pre_[size_t(i)]);
    attended = mixed_.data();
  }
  out.forward(attended, rows, y);
}

template <typename T>
void AttentionLayer<T>::backward(const T* x, const T* dy, int64_t batch, T* dx) {
  const int64_t n = tokens(), d = config.dim, h = config.heads, dh = d / h, rows = batch * n;
  const AttentionDesign& design = config.design;
  const std::vector<int64_t> shape{batch, n, h, dh};
  const T* input = config.conv_kernel > 0 ? conv_out_.data() : x;
  const T* summed = design.value_conv > 0 ? position_.data() : o_.data();
  for (auto* buffer : {&grad_o_, &grad_q_, &grad_k_, &grad_v_}) buffer->resize(size_t(rows * d));
  if (design.gated_head) {
    grad_normed_.resize(size_t(rows * d));
    grad_gate_.resize(size_t(rows * d));
    out.backward(mixed_.data(), dy, rows, grad_normed_.data());
    for (int64_t i = 0; i < rows * d; ++i) {
      const T g = gate_pre_[size_t(i)], up = grad_normed_[size_t(i)];
      const T s = sigmoid(g);  // silu(g) = g s, silu'(g) = s (1 + g (1 - s))
      grad_gate_[size_t(i)] = up * normed_[size_t(i)] * s * (T(1) + g * (T(1) - s));
      grad_normed_[size_t(i)] = up * g * s;
    }
    head_norm.backward(summed, grad_normed_.data(), rows * h, grad_o_.data());
  } else {
    out.backward(summed, dy, rows, grad_o_.data());
  }
  TensorView<const T> q{q_.data(), shape}, k{k_.data(), shape}, v{v_.data(), shape},
      o{o_.data(), shape}, go{grad_o_.data(), shape};
  TensorView<T> gq{grad_q_.data(), shape}, gk{grad_k_.data(), shape}, gv{grad_v_.data(), shape};
  switch (config.kind) {
    case AttentionKind::softmax:
      softmax_attention_backward<T>({config.causal, {}}, q, k, v, o, {lse_.data(), {batch, h, n}},
                                    go, gq, gk, gv);
      break;
    case AttentionKind::linear:
      linear_attention_backward<T>(operator_options(), q, k, v, o, go, gq, gk, gv);
      break;
    case AttentionKind::mhla: {
      const Options options = operator_options();
      const int64_t m = config.layout.num_blocks(), wh = mixing_heads();
      grad_w_.assign(size_t(wh * m * m), T(0));
      mhla::backward<T>(options, q, k, v, {w_.data(), mixing_shape()}, o, go, gq, gk, gv,
                        {grad_w_.data(), mixing_shape()}, state_);
      T* grad = mixing_parameter.grad.data();
      if (design.mixing_param == MixingParam::clamp) {
        for (size_t i = 0; i < grad_w_.size(); ++i) grad[i] += grad_w_[i];
        break;
      }
      // Through the row softmax: dl = W * (dW - sum_c W dW); masked entries stay 0.
      for (int64_t r = 0; r < wh * m; ++r) {
        const T* wr = w_.data() + r * m;
        const T* gr = grad_w_.data() + r * m;
        double dot = 0;
        for (int64_t b = 0; b < m; ++b) dot += double(wr[b]) * gr[b];
        for (int64_t b = 0; b < m; ++b) grad[r * m + b] += wr[b] * (gr[b] - T(dot));
      }
      break;
    }
  }
  if (design.value_conv > 0) value_term_backward(v_.data(), grad_o_.data(), batch, grad_v_.data());
  if (design.rope) {
    rotate_positions(grad_q_.data(), batch, n, h, dh, true);
    rotate_positions(grad_k_.data(), batch, n, h, dh, true);
  }
  grad_qkv_.resize(size_t(rows * 3 * d));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = grad_qkv_.data() + r * 3 * d;
    std::copy(grad_q_.data() + r * d, grad_q_.data() + (r + 1) * d, dst);
    std::copy(grad_k_.data() + r * d, grad_k_.data() + (r + 1) * d, dst + d);
    std::copy(grad_v_.data() + r * d, grad_v_.data() + (r + 1) * d, dst + 2 * d);
  }
  T* grad_input = dx;
  if (config.conv_kernel > 0) {
    grad_conv_.resize(size_t(rows * d));
    grad_input = grad_conv_.data();
  }
  qkv.backward(input, grad_qkv_.data(), rows, grad_input);
  if (design.gated_head) {
    grad_in_.resize(size_t(rows * d));
    gate.backward(input, grad_gate_.data(), rows, grad_in_.data());
    for (int64_t i = 0; i < rows * d; ++i) grad_input[i] += grad_in_[size_t(i)];
  }
  if (config.conv_kernel > 0) conv.backward(x, grad_conv_.data(), batch, n, dx);
}

template <typename T>
std::vector<double> AttentionLayer<T>::attention_matrix(int64_t sample, int64_t head) const {
  const int64_t n = tokens(), h = config.heads, dh = config.dim / h;
  if (q_.empty() || sample < 0 || head < 0 || head >= h ||
      (sample + 1) * n * config.dim > int64_t(q_.size()))
    throw Error("attention_matrix: sample " + std::to_string(sample) + ", head " +
                std::to_string(head) + " is not in the last forward pass");
  const size_t first = size_t(sample * n * config.dim), count = size_t(n * config.dim);
  const std::vector<double> q(q_.begin() + long(first), q_.begin() + long(first + count)),
      k(k_.begin() + long(first), k_.begin() + long(first + count));
  const std::vector<int64_t> shape{1, n, h, dh};
  const TensorView<const double> qv{q.data(), shape}, kv{k.data(), shape};
  switch (config.kind) {
    case AttentionKind::softmax:
      return reference::softmax_attention_matrix({config.causal, {}}, qv, kv, 0, head);
    case AttentionKind::linear: {
      // Linear attention is MHLA with one block and W = [[1]].
      Options options = operator_options();
      options.layout = TokenLayout::sequence(n, n);
      const double one = 1;
      return reference::mhla_attention_matrix(options, qv, kv, {&one, {1, 1}}, 0, head);
    }
    case AttentionKind::mhla: {
      const std::vector<double> w(w_.begin(), w_.end());
      return reference::mhla_attention_matrix(operator_options(), qv, kv,
                                              {w.data(), mixing_shape()}, 0, head);
    }
  }
  return {};
}

template class AttentionLayer<float>;
template class AttentionLayer<double>;

}  // namespace mhla::train
