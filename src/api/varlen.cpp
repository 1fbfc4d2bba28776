// Packed variable-length batches: validate everything once, then run each
// sequence as its own 1D problem through the device's kernels on the packed tensors
// (a sequence's rows are contiguous in [1, total, H, D]; a dense w is read in
// place through its row stride, never copied).
#include "mhla/varlen.hpp"

#include <algorithm>

#include "api/varlen_checks.hpp"
#include "backend/backend.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"
#include "core/validated_call.hpp"

namespace mhla {
namespace {

using detail::fail;

struct Packing {
  detail::Problem problem;       // options and mixing of every sequence; batch 1, tokens = total
  std::vector<int64_t> offsets;  // cu_seqlens
};

int64_t blocks_of(int64_t tokens, int64_t block) { return (tokens + block - 1) / block; }

// Every check of a packed call but w's values: shapes, options, devices, the offsets.
template <typename T>
Packing check_packing_layout(const char* fn, const VarlenOptions& options,
                             const TensorView<const int64_t>& cu, const TensorView<const T>& q,
                             const TensorView<const T>& k, const TensorView<const T>& v,
                             const TensorView<const T>& w) {
  Packing p;
  const detail::AttentionDims dims = detail::check_qkv(fn, q, k, v);
  if (dims.batch != 1)
    fail(fn,
         "packed q must have batch 1 ([1, total, H, Dk]), got shape " + shape_to_string(q.shape));
  if (options.block <= 0)
    fail(fn, "options.block must be positive, got " + std::to_string(options.block));
  detail::check_device(fn, "cu_seqlens", cu.device);
  detail::check_device(fn, "w", w.device);
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
  if (p.offsets.back() != dims.tokens)
    fail(fn, "cu_seqlens ends at " + std::to_string(p.offsets.back()) +
                 " but the packed tensors hold N = " + std::to_string(dims.tokens) + " tokens");

  detail::Problem& problem = p.problem;
  problem = detail::check_linear_options(fn, options, dims);
  const int64_t needed = blocks_of(longest, options.block);
  if (options.mixing == MixingForm::toeplitz) {
    detail::check_toeplitz_shape(fn, options.masking, w.shape, w.data, problem);
  } else {
    detail::check_square_mixing_shape(fn, w.shape, w.data, problem);
    if (needed > problem.blocks)
      fail(fn, "w covers " + std::to_string(problem.blocks) + " blocks (" +
                   std::to_string(problem.blocks * options.block) + " tokens in blocks of " +
                   std::to_string(options.block) + ") but the longest sequence has " +
                   std::to_string(longest) + " tokens = " + std::to_string(needed) +
                   " blocks; use a larger w or Toeplitz mixing");
    // Only the corner the longest sequence reads is checked, as each sequence reads its own.
    problem.mixing_blocks = needed;
  }
  return p;
}

template <typename T>
Packing check_packing(const char* fn, const VarlenOptions& options,
                      const TensorView<const int64_t>& cu, const TensorView<const T>& q,
                      const TensorView<const T>& k, const TensorView<const T>& v,
                      const TensorView<const T>& w) {
  Packing p = check_packing_layout(fn, options, cu, q, k, v, w);
  detail::check_mixing_values(fn, p.problem, w.data);
  return p;
}

// Sequence s's problem: its tokens, blocks and the top-left corner of a dense w.
detail::Problem sequence_problem(const Packing& p, const TokenLayout& layout) {
  detail::Problem seq = p.problem;
  seq.tokens = layout.num_tokens();
  seq.blocks = seq.mixing_blocks = layout.num_blocks();
  return seq;
}

// Rows first .. first + tokens - 1 of a packed [1, total, H, width] tensor.
template <typename U>
TensorView<U> rows(const TensorView<U>& packed, int64_t first, int64_t tokens) {
  const int64_t heads = packed.shape[2], width = packed.shape[3];
  return {packed.data + first * heads * width, {1, tokens, heads, width}};
}

// Runs body(), prefixing any error with the sequence it concerns.
template <typename Fn>
void for_sequence(const char* fn, const Packing& p, int64_t s, Fn&& body) {
  try {
    body();
  } catch (const Error& e) {
    fail(fn, "sequence " + std::to_string(s) + " (tokens " + std::to_string(p.offsets[s]) + ".." +
                 std::to_string(p.offsets[s + 1] - 1) + "): " + e.what());
  }
}

// Runs body(s, seq_problem, kernels, seq_rows) for each non-empty sequence s,
// where seq_rows(t) is s's rows of a packed tensor t.
template <typename T, typename Body>
void for_each_sequence(const char* fn, const Packing& p, const VarlenOptions& options,
                       const TensorView<const T>& q, const TensorView<const T>& w, Body&& body) {
  const backend::Backend& device = backend::backend_for(fn, "q", q.device);
  for (int64_t s = 0; s + 1 < int64_t(p.offsets.size()); ++s) {
    const int64_t first = p.offsets[s], tokens = p.offsets[s + 1] - first;
    if (tokens == 0) continue;
    TokenLayout layout = TokenLayout::sequence(tokens, options.block);
    detail::Problem problem = sequence_problem(p, layout);
    const detail::ValidatedCall call(std::move(problem), std::move(layout));
    body(s, call.problem(), *device.attention(call.problem(), w.data),
         [&](const auto& t) { return rows(t, first, tokens); });
  }
}

}  // namespace

namespace detail {

void check_varlen_shapes(const VarlenOptions& options, const std::vector<int64_t>& cu_seqlens,
                         const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
                         const std::vector<int64_t>& v_shape, const std::vector<int64_t>& w_shape) {
  // Shapes only: any non-null address passes the pointer checks, and no data is read.
  const float marker = 0;
  const int64_t no_offsets = 0;
  const TensorView<const int64_t> cu(cu_seqlens.empty() ? &no_offsets : cu_seqlens.data(),
                                     {int64_t(cu_seqlens.size())});
  check_packing_layout<float>("mhla::varlen_forward", options, cu, {&marker, q_shape},
                              {&marker, k_shape}, {&marker, v_shape}, {&marker, w_shape});
}

}  // namespace detail

template <typename T>
void varlen_forward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                    TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                    TensorView<const T> w, TensorView<T> o) {
  const char* fn = "mhla::varlen_forward";
  const Packing p = check_packing(fn, options, cu_seqlens, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.problem));
  for_each_sequence(fn, p, options, q, w,
                    [&](int64_t s, const detail::Problem& seq, const backend::Attention<T>& kernels,
                        const auto& seq_rows) {
                      if (!kernels.forward(seq_rows(q).data, seq_rows(k).data, seq_rows(v).data,
                                           seq_rows(o).data, nullptr, nullptr))
                        for_sequence(fn, p, s, [&] {
                          detail::report_non_finite_output("mhla::forward", seq, seq_rows(q),
                                                           seq_rows(k), seq_rows(v), seq_rows(o));
                        });
                    });
}

template <typename T>
void varlen_backward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                     TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                     TensorView<const T> w, TensorView<const T> o, TensorView<const T> grad_o,
                     TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v,
                     TensorView<T> grad_w) {
  const char* fn = "mhla::varlen_backward";
  const Packing p = check_packing(fn, options, cu_seqlens, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.problem));
  detail::check_gradients(fn, p.problem, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  // Every sequence adds its part of grad_w, in order, so the sum is deterministic.
  backend::zero(backend::backend_for(fn, "grad_w", grad_w.device).memory(), grad_w.data,
                detail::checked_product(w.shape, "w"));
  for_each_sequence(fn, p, options, q, w,
                    [&](int64_t s, const detail::Problem& seq, const backend::Attention<T>& kernels,
                        const auto& seq_rows) {
                      const bool finite = kernels.backward(
                          seq_rows(q).data, seq_rows(k).data, seq_rows(v).data,
                          seq_rows(grad_o).data, seq_rows(grad_q).data, seq_rows(grad_k).data,
                          seq_rows(grad_v).data, grad_w.data, nullptr, nullptr);
                      if (!finite)
                        for_sequence(fn, p, s, [&] {
                          detail::report_non_finite_gradients("mhla::backward", seq, seq_rows(q),
                                                              seq_rows(k), seq_rows(v), seq_rows(o),
                                                              seq_rows(grad_o), seq_rows(grad_q),
                                                              seq_rows(grad_k), seq_rows(grad_v));
                        });
                    });
  if (detail::first_non_finite(grad_w.data, detail::checked_product(w.shape, "w")) >= 0)
    detail::report_non_finite<T>(fn, p.problem, {{"grad_w", grad_w.data, w.shape}},
                                 {{"q", q.data, q.shape},
                                  {"k", k.data, k.shape},
                                  {"v", v.data, v.shape},
                                  {"o", o.data, o.shape},
                                  {"grad_o", grad_o.data, grad_o.shape}},
                                 detail::FlagCovers::results_maybe_more);
}

#define MHLA_INSTANTIATE_VARLEN(T)                                                                \
  template void varlen_forward<T>(const VarlenOptions&, TensorView<const int64_t>,                \
                                  TensorView<const T>, TensorView<const T>, TensorView<const T>,  \
                                  TensorView<const T>, TensorView<T>);                            \
  template void varlen_backward<T>(const VarlenOptions&, TensorView<const int64_t>,               \
                                   TensorView<const T>, TensorView<const T>, TensorView<const T>, \
                                   TensorView<const T>, TensorView<const T>, TensorView<const T>, \
                                   TensorView<T>, TensorView<T>, TensorView<T>, TensorView<T>);
MHLA_INSTANTIATE_VARLEN(float)
MHLA_INSTANTIATE_VARLEN(double)
#undef MHLA_INSTANTIATE_VARLEN

}  // namespace mhla
