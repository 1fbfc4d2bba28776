#include <algorithm>
#include <vector>

#include "cpu/mixer.hpp"
#include "cpu/panels.hpp"

namespace mhla::cpu {
namespace {

// y[0:n] += a * x[0:n]
template <typename T>
void add_scaled(int64_t n, T a, const T* x, T* y) {
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

template <typename T>
T dot(int64_t n, const T* x, const T* y) {
  T acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += x[c] * y[c];
  return acc;
}

}  // namespace

template <typename T>
ToeplitzMixer<T>::ToeplitzMixer(const mhla::detail::Problem& problem, const T* w)
    : p_(problem),
      w_(w),
      length_(problem.toeplitz_length),
      nearest_(problem.causal ? 1 : 0),
      tail_start_(std::max(length_, nearest_)),
      x_(problem.dk * (problem.dv + 1)) {}

template <typename T>
const T* ToeplitzMixer<T>::head_w(int64_t bh) const {
  return p_.per_head_mixing ? w_ + (bh % p_.heads) * (length_ + 1) : w_;
}

template <typename T>
void ToeplitzMixer<T>::mix(const T* summaries, T* mixed) const {
  const int64_t m = p_.blocks, ms = p_.mixing_blocks, first = p_.first_block;
  const int64_t slices = p_.batch * p_.heads;
  for_each_panel(slices, x_, [&](int64_t, int64_t bh, int64_t c0, int64_t cols) {
    const T* w = head_w(bh);
    const T* s = summaries + bh * ms * x_ + c0;
    T* out = mixed + bh * m * x_ + c0;
    std::vector<T> far(cols, T(0));  // sum of S_b over b <= i - tail_start
    // Rows before the call's first one only advance the running sum.
    for (int64_t i = 0; i < first + m; ++i) {
      if (i >= tail_start_) add_scaled(cols, T(1), s + (i - tail_start_) * x_, far.data());
      if (i < first) continue;
      T* out_i = out + (i - first) * x_;
      for (int64_t c = 0; c < cols; ++c) out_i[c] = w[length_] * far[c];
      for (int64_t d = nearest_; d <= std::min(i, length_ - 1); ++d)
        add_scaled(cols, w[d], s + (i - d) * x_, out_i);
    }
  });
}

template <typename T>
void ToeplitzMixer<T>::mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                                    T* summaries_grad, T* grad_w) const {
  const int64_t m = p_.blocks, ms = p_.mixing_blocks, first = p_.first_block;
  const int64_t heads = p_.heads, slices = p_.batch * heads;
  const int64_t entries = length_ + 1, panels = count_panels(x_, kPanel);
  // Each (slice, panel) task writes its own partial dw; they are summed below in
  // a fixed order.
  std::vector<T> partial(size_t(slices * panels * entries), T(0));
  for_each_panel(slices, x_, [&](int64_t task, int64_t bh, int64_t c0, int64_t cols) {
    const T* w = head_w(bh);
    const T* g = mixed_grad + bh * m * x_ + c0;  // row i of W is g's row i - first
    const T* s = summaries + bh * ms * x_ + c0;
    T* out = summaries_grad + bh * ms * x_ + c0;
    T* dw = partial.data() + task * entries;
    // dS_b = sum_{d < L} w[d] dmixed_{b+d} + w[L] sum_{i >= b + tail_start} dmixed_i,
    // dw[d] = sum_i <dmixed_i, S_{i-d}>, dw[L] = sum_b <S_b, the same suffix sum>,
    // over the rows i the call mixed.
    std::vector<T> far(cols, T(0));
    for (int64_t b = ms - 1; b >= 0; --b) {
      T* out_b = out + b * x_;
      if (b + tail_start_ >= first && b + tail_start_ < first + m)
        add_scaled(cols, T(1), g + (b + tail_start_ - first) * x_, far.data());
      for (int64_t c = 0; c < cols; ++c) out_b[c] = w[length_] * far[c];
      dw[length_] += dot(cols, s + b * x_, far.data());
      for (int64_t d = std::max(nearest_, first - b); d <= std::min(length_ - 1, first + m - 1 - b);
           ++d) {
        add_scaled(cols, w[d], g + (b + d - first) * x_, out_b);
        dw[d] += dot(cols, g + (b + d - first) * x_, s + b * x_);
      }
    }
  });

  // Sum over panels, then the batch (and heads when w is shared), in a fixed
  // order; the causal in-block terms dW[i,i] all belong to w[0].
  for (int64_t bh = 0; bh < slices; ++bh) {
    T* dst = grad_w + (p_.per_head_mixing ? bh % heads : 0) * entries;
    for (int64_t panel = 0; panel < panels; ++panel)
      for (int64_t d = 0; d < entries; ++d) dst[d] += partial[(bh * panels + panel) * entries + d];
    if (diagonal_grad)
      for (int64_t i = 0; i < m; ++i) dst[0] += diagonal_grad[bh * m + i];
  }
}

template <typename T>
std::unique_ptr<Mixer<T>> make_mixer(const mhla::detail::Problem& problem, const T* w) {
  if (problem.toeplitz) return std::make_unique<ToeplitzMixer<T>>(problem, w);
  return std::make_unique<DenseMixer<T>>(problem, w);
}

template class ToeplitzMixer<float>;
template class ToeplitzMixer<double>;
template std::unique_ptr<Mixer<float>> make_mixer(const mhla::detail::Problem&, const float*);
template std::unique_ptr<Mixer<double>> make_mixer(const mhla::detail::Problem&, const double*);

}  // namespace mhla::cpu
