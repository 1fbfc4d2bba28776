// Packed variable-length batches: validate the packing once, then run each
// sequence as its own 1D problem through the operator on views of the packed
// tensors (a sequence's rows are contiguous in [1, total, H, D]).
#include "mhla/varlen.hpp"

#include <algorithm>

#include "core/mixing_corner.hpp"
#include "core/validate.hpp"
#include "mhla/operator.hpp"

namespace mhla {
namespace {

using detail::fail;

struct Packing {
  detail::AttentionDims dims;    // batch 1, tokens = total
  std::vector<int64_t> offsets;  // cu_seqlens
  int64_t copies = 1;            // w's leading count: H per head, 1 shared
  int64_t w_blocks = 0;          // dense w: M
};

int64_t blocks_of(int64_t tokens, int64_t block) { return (tokens + block - 1) / block; }

template <typename T>
Packing check_packing(const char* fn, const VarlenOptions& options,
                      const TensorView<const int64_t>& cu, const TensorView<const T>& q,
                      const TensorView<const T>& k, const TensorView<const T>& v,
                      const TensorView<const T>& w) {
  Packing p;
  p.dims = detail::check_qkv(fn, q.data, q.shape, k.data, k.shape, v.data, v.shape);
  if (p.dims.batch != 1)
    fail(fn, "packed q must have batch 1 ([1, total, H, Dk]), got shape " +
                 shape_to_string(q.shape));
  if (options.block <= 0)
    fail(fn, "options.block must be positive, got " + std::to_string(options.block));
  detail::check_tensor(fn, "cu_seqlens", cu.data, cu.shape, 1, "[S + 1]");
  if (cu.shape[0] < 2)
    fail(fn, "cu_seqlens needs S + 1 >= 2 offsets, got shape " + shape_to_string(cu.shape));
  p.offsets.assign(cu.data, cu.data + cu.shape[0]);
  if (p.offsets.front() != 0)
    fail(fn, "cu_seqlens[0] must be 0, got " + std::to_string(p.offsets.front()));
  int64_t longest = 0;
  for (size_t s = 0; s + 1 < p.offsets.size(); ++s) {
    if (p.offsets[s + 1] < p.offsets[s])
      fail(fn, "cu_seqlens must be non-decreasing, but cu_seqlens[" + std::to_string(s + 1) +
                   "] = " + std::to_string(p.offsets[s + 1]) + " < cu_seqlens[" +
                   std::to_string(s) + "] = " + std::to_string(p.offsets[s]));
    longest = std::max(longest, p.offsets[s + 1] - p.offsets[s]);
  }
  if (p.offsets.back() != p.dims.tokens)
    fail(fn, "cu_seqlens ends at " + std::to_string(p.offsets.back()) +
                 " but the packed tensors hold N = " + std::to_string(p.dims.tokens) + " tokens");

  detail::Problem mixing;
  mixing.dims = p.dims;
  if (options.mixing == MixingForm::toeplitz) {
    detail::check_toeplitz_shape(fn, options.masking, w.shape, w.data, mixing);
  } else {
    detail::check_square_mixing_shape(fn, w.shape, w.data, mixing);
    p.w_blocks = mixing.blocks;
    if (blocks_of(longest, options.block) > p.w_blocks)
      fail(fn, "w covers " + std::to_string(p.w_blocks) + " blocks (" +
                   std::to_string(p.w_blocks * options.block) + " tokens in blocks of " +
                   std::to_string(options.block) + ") but the longest sequence has " +
                   std::to_string(longest) + " tokens = " +
                   std::to_string(blocks_of(longest, options.block)) +
                   " blocks; use a larger w or Toeplitz mixing");
  }
  p.copies = mixing.per_head_mixing ? p.dims.heads : 1;
  return p;
}

// Sequence s's operator call: its options, its row range and its w.
template <typename T>
struct Sequence {
  Options options;
  int64_t first = 0, tokens = 0;
  std::vector<T> corner;        // dense w: the top-left M_s x M_s of every copy
  std::vector<int64_t> w_shape;

  // Rows first .. first + tokens - 1 of a packed [1, total, H, width] tensor.
  template <typename U>
  TensorView<U> rows(const TensorView<U>& packed) const {
    const int64_t heads = packed.shape[2], width = packed.shape[3];
    return {packed.data + first * heads * width, {1, tokens, heads, width}};
  }
};

template <typename T>
Sequence<T> sequence(const VarlenOptions& options, const Packing& p, const TensorView<const T>& w,
                     int64_t s) {
  Sequence<T> seq;
  static_cast<LinearAttentionOptions&>(seq.options) = options;
  seq.options.mixing = options.mixing;
  seq.first = p.offsets[s];
  seq.tokens = p.offsets[s + 1] - p.offsets[s];
  seq.options.layout = TokenLayout::sequence(seq.tokens, options.block);
  if (options.mixing == MixingForm::toeplitz) {
    seq.w_shape = w.shape;
    return seq;
  }
  const int64_t m = seq.options.layout.num_blocks();
  seq.corner = detail::mixing_corner(w.data, p.copies, p.w_blocks, m);
  seq.w_shape = p.copies > 1 ? std::vector<int64_t>{p.copies, m, m} : std::vector<int64_t>{m, m};
  return seq;
}

template <typename T>
TensorView<const T> mixing_of(const Sequence<T>& seq, const TensorView<const T>& w) {
  if (seq.corner.empty()) return {w.data, seq.w_shape};
  return {seq.corner.data(), seq.w_shape};
}

// Runs fn(), prefixing any error with the sequence it concerns.
template <typename Fn>
void for_sequence(const char* fn, const Packing& p, int64_t s, Fn&& body) {
  try {
    body();
  } catch (const Error& e) {
    fail(fn, "sequence " + std::to_string(s) + " (tokens " + std::to_string(p.offsets[s]) +
                 ".." + std::to_string(p.offsets[s + 1] - 1) + "): " + e.what());
  }
}

}  // namespace

template <typename T>
void varlen_forward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                    TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                    TensorView<const T> w, TensorView<T> o) {
  const char* fn = "mhla::varlen_forward";
  const Packing p = check_packing(fn, options, cu_seqlens, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  for (int64_t s = 0; s + 1 < int64_t(p.offsets.size()); ++s) {
    if (p.offsets[s + 1] == p.offsets[s]) continue;
    const Sequence<T> seq = sequence(options, p, w, s);
    for_sequence(fn, p, s, [&] {
      forward<T>(seq.options, seq.rows(q), seq.rows(k), seq.rows(v), mixing_of(seq, w),
                 seq.rows(o));
    });
  }
}

template <typename T>
void varlen_backward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                     TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                     TensorView<const T> w, TensorView<const T> o, TensorView<const T> grad_o,
                     TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v,
                     TensorView<T> grad_w) {
  const char* fn = "mhla::varlen_backward";
  const Packing p = check_packing(fn, options, cu_seqlens, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  detail::check_gradients(fn, p.dims, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const int64_t w_size = detail::checked_product(w.shape, "w");
  std::fill(grad_w.data, grad_w.data + w_size, T(0));
  std::vector<T> seq_grad_w;
  for (int64_t s = 0; s + 1 < int64_t(p.offsets.size()); ++s) {
    if (p.offsets[s + 1] == p.offsets[s]) continue;
    const Sequence<T> seq = sequence(options, p, w, s);
    seq_grad_w.assign(size_t(detail::checked_product(seq.w_shape, "w")), T(0));
    for_sequence(fn, p, s, [&] {
      backward<T>(seq.options, seq.rows(q), seq.rows(k), seq.rows(v), mixing_of(seq, w),
                  seq.rows(o), seq.rows(grad_o), seq.rows(grad_q), seq.rows(grad_k),
                  seq.rows(grad_v), {seq_grad_w.data(), seq.w_shape});
    });
    // Sequences add their gradients in order, so the sum is deterministic.
    if (seq.corner.empty()) {
      for (int64_t e = 0; e < w_size; ++e) grad_w.data[e] += seq_grad_w[e];
      continue;
    }
    const int64_t m = seq.w_shape.back(), big = p.w_blocks;
    for (int64_t c = 0; c < p.copies; ++c)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t b = 0; b < m; ++b)
          grad_w.data[(c * big + i) * big + b] += seq_grad_w[(c * m + i) * m + b];
  }
}

#define MHLA_INSTANTIATE_VARLEN(T)                                                             \
  template void varlen_forward<T>(const VarlenOptions&, TensorView<const int64_t>,             \
                                  TensorView<const T>, TensorView<const T>,                    \
                                  TensorView<const T>, TensorView<const T>, TensorView<T>);    \
  template void varlen_backward<T>(const VarlenOptions&, TensorView<const int64_t>,            \
                                   TensorView<const T>, TensorView<const T>,                   \
                                   TensorView<const T>, TensorView<const T>,                   \
                                   TensorView<const T>, TensorView<const T>, TensorView<T>,    \
                                   TensorView<T>, TensorView<T>, TensorView<T>);
MHLA_INSTANTIATE_VARLEN(float)
MHLA_INSTANTIATE_VARLEN(double)
#undef MHLA_INSTANTIATE_VARLEN

}  // namespace mhla
