#pragma once
// Finite inputs must never come back as silent NaN or infinity. The normalized
// read-out num / (den + eps) can still produce them: its denominator can be
// exactly 0 (eps = 0 with all-zero features, or the identity map's signed sums
// cancelling), and phi(q)^T S~ can overflow T where |q| |k| |v| nears T's
// range. Computing around that would cost every call. Instead the kernels note
// whether what they wrote is finite while it is still in cache, and only then
// is this search run, to name the entry and the cause. Non-finite inputs
// propagate as IEEE arithmetic does, as any tensor library's ops do.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/validate.hpp"
#include "mhla/tensor.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla::detail {

// One tensor taking part in a call: its name for messages, its data and shape.
template <typename T>
struct NamedTensor {
  const char* name;
  const T* data;
  std::vector<int64_t> shape;
};

// Index of the first entry that is not finite, or -1. Chunks are summed as
// x * 0 (NaN exactly when x is infinite or NaN) so the scan vectorises without
// branches; only a flagged chunk is searched element by element.
template <typename T>
int64_t first_non_finite(const T* x, int64_t n) {
  constexpr int64_t kChunk = 1024;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    T probe = 0;
#pragma omp simd reduction(+ : probe)
    for (int64_t i = start; i < end; ++i) probe += x[i] * T(0);
    if (probe == probe) continue;
    for (int64_t i = start; i < end; ++i)
      if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

// "o[0, 5, 1, 2]" for flat index 73 of a tensor of `shape`.
std::string element_name(const char* name, const std::vector<int64_t>& shape, int64_t flat);

template <typename T>
double largest_magnitude(const T* x, int64_t n) {
  T largest = 0;
#pragma omp simd reduction(max : largest)
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::abs(x[i]));
  return double(largest);
}

// The causes of a non-finite MHLA or linear-attention result in this problem's
// mode, with their remedies; `type` names the results' element type
// ("float64", "float32", "bfloat16", "float16").
std::string non_finite_reason(const Problem& problem, const std::string& type);

// "<what> is not finite although every input is finite (|q| <= ..., ...): <causes>":
// the words of every path's report (the kernels' below, and the plain-torch
// path's through the Python extension), so that the paths cannot drift apart.
std::string non_finite_message(const std::string& what,
                               const std::vector<std::pair<std::string, double>>& magnitudes,
                               const Problem& problem, const std::string& type);

// What a kernel's "not all finite" flag covers.
enum class FlagCovers {
  // forward: an overflowed denominator turns a representable output into a silent 0
  results_and_denominators,
  // backward: may also be raised by a scratch column that is no result
  results_maybe_more,
};

// Called when a kernel raised its flag. Returns if some input is not finite
// (propagation), or if the flag may be a false alarm and every result is
// finite; otherwise throws mhla::Error naming the first non-finite result
// entry, or the denominator, with the inputs' magnitudes and the mode's
// possible causes.
// `type` names the results' element type where T is wider than it (the
// 16-bit operators' results read as float); by default T's own.
template <typename T>
void report_non_finite(const char* fn, const Problem& problem,
                       const std::vector<NamedTensor<T>>& results,
                       const std::vector<NamedTensor<T>>& inputs, FlagCovers flag,
                       const char* type = nullptr) {
  std::string what;
  for (const NamedTensor<T>& r : results) {
    const int64_t bad = first_non_finite(r.data, checked_product(r.shape, r.name));
    if (bad < 0) continue;
    what = element_name(r.name, r.shape, bad) + " = " + format_number(r.data[bad]);
    break;
  }
  if (what.empty() && flag == FlagCovers::results_maybe_more) return;
  if (what.empty()) what = "the read-out's denominator phi(q)^T z~ + eps";
  std::vector<std::pair<std::string, double>> magnitudes;
  for (const NamedTensor<T>& in : inputs) {
    const int64_t n = checked_product(in.shape, in.name);
    if (first_non_finite(in.data, n) >= 0) return;  // NaN or inf in, NaN or inf out
    magnitudes.emplace_back(in.name, largest_magnitude(in.data, n));
  }
  fail(fn, non_finite_message(what, magnitudes, problem,
                              type             ? type
                              : sizeof(T) == 4 ? "float32"
                                               : "float64"));
}

// The forward pass's report: o from q, k and v.
template <typename T>
void report_non_finite_output(const char* fn, const Problem& problem, const TensorView<const T>& q,
                              const TensorView<const T>& k, const TensorView<const T>& v,
                              const TensorView<T>& o, const char* type = nullptr) {
  report_non_finite<T>(fn, problem, {{"o", o.data, o.shape}},
                       {{"q", q.data, q.shape}, {"k", k.data, k.shape}, {"v", v.data, v.shape}},
                       FlagCovers::results_and_denominators, type);
}

// The backward pass's report: the gradients (grad_w when the call has one)
// from q, k, v, o and grad_o.
template <typename T>
void report_non_finite_gradients(const char* fn, const Problem& problem,
                                 const TensorView<const T>& q, const TensorView<const T>& k,
                                 const TensorView<const T>& v, const TensorView<const T>& o,
                                 const TensorView<const T>& grad_o, const TensorView<T>& grad_q,
                                 const TensorView<T>& grad_k, const TensorView<T>& grad_v,
                                 const TensorView<T>& grad_w = {}) {
  std::vector<NamedTensor<T>> results = {{"grad_q", grad_q.data, grad_q.shape},
                                         {"grad_k", grad_k.data, grad_k.shape},
                                         {"grad_v", grad_v.data, grad_v.shape}};
  if (grad_w.data) results.push_back({"grad_w", grad_w.data, grad_w.shape});
  report_non_finite<T>(fn, problem, results,
                       {{"q", q.data, q.shape},
                        {"k", k.data, k.shape},
                        {"v", v.data, v.shape},
                        {"o", o.data, o.shape},
                        {"grad_o", grad_o.data, grad_o.shape}},
                       FlagCovers::results_maybe_more);
}

// After a float result has been rounded to float16 (the float16 operator
// computes in float): throws mhla::Error naming the first entry of `result`
// (float values on the host) that is finite in float but beyond float16's
// range, so that it would come back as infinity. `remedy` says what to change.
void check_float16_range(const char* fn, const NamedTensor<float>& result, const char* remedy);

// "<element> is beyond float16's range ...; <remedy>, ...": the words of both
// paths' report of a float16 result that overflows (the plain-torch path sees
// it as infinity, so the value is not part of them).
std::string float16_range_message(const std::string& element, const std::string& remedy);

// The softmax baseline's report of a result that is not finite from finite
// q, k and v: its scores overflow (|q| |k| scale beyond the type's range), where
// the exact rows are one-hot but the log-sum-exp that backward reads is not
// representable. Both paths' words; without magnitudes (a deferred check)
// the parenthesis goes.
std::string softmax_overflow_message(const std::vector<std::pair<std::string, double>>& magnitudes,
                                     double scale, const std::string& type);

}  // namespace mhla::detail
