#pragma once
// Argument checks at the API boundary. Each public entry point validates once,
// here, and the kernels behind it assume valid input (debug asserts only).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/block_table.hpp"
#include "core/host_copy.hpp"
#include "core/problem_params.hpp"
#include "mhla/device_execution.hpp"
#include "mhla/error.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla::detail {

// Everything a kernel needs to know about a validated MHLA (or linear) call:
// its sizes and flags, and where its blocks' tokens are.
struct Problem : ProblemParams {
  // The token layout (what the references and messages read; nullptr for the
  // linear-attention baseline) and the same blocks as the flat table that the
  // kernels read, set by the entry point, which owns the BlockTable, right
  // before it runs the backend.
  const TokenLayout* layout = nullptr;
  BlockTableView table;
  // DeviceChecks::deferred on a device: w's values and the results are
  // checked by the backend on the device and read back later, not here.
  bool checks_on_device = false;
};

[[noreturn]] void fail(const char* fn, const std::string& message);

// "1e+19": short, exact enough to show the scale of a value in a message.
std::string format_number(double x);

// Checks rank, positive sizes, element-count overflow and a non-null pointer.
void check_tensor(const char* fn, const char* name, const void* data,
                  const std::vector<int64_t>& shape, size_t rank, const char* layout_hint);

void check_shape_equals(const char* fn, const char* name, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& expected, const char* layout_hint);

AttentionDims check_qkv(const char* fn, const void* q, const std::vector<int64_t>& q_shape,
                        const void* k, const std::vector<int64_t>& k_shape, const void* v,
                        const std::vector<int64_t>& v_shape);

// The tensor is on the call's device. Entry points that run on the CPU only
// leave `call_device` at its default; the operator's run on any device of
// this build (backend_for, api/backends.cpp) and pass q's.
void check_device(const char* fn, const char* name, Device device,
                  Device call_device = Device::cpu);

// Whether this build has a backend for `device` (api/backends.cpp).
bool has_backend(Device device);

// check_qkv on views, their devices included.
template <typename T>
AttentionDims check_qkv(const char* fn, const TensorView<T>& q, const TensorView<T>& k,
                        const TensorView<T>& v, Device call_device = Device::cpu) {
  check_device(fn, "q", q.device, call_device);
  check_device(fn, "k", k.device, call_device);
  check_device(fn, "v", v.device, call_device);
  return check_qkv(fn, q.data, q.shape, k.data, k.shape, v.data, v.shape);
}

// eps, scale and the feature map of linear or MHLA options; returns the problem
// without layout or mixing information.
Problem check_linear_options(const char* fn, const LinearAttentionOptions& options,
                             const AttentionDims& dims);

// The layout is set and holds exactly `tokens` tokens.
void check_layout_tokens(const char* fn, const TokenLayout& layout, int64_t tokens);

// Toeplitz w: [L + 1] or [H, L + 1], with masking that reads b <= i only.
void check_toeplitz_shape(const char* fn, Masking masking, const std::vector<int64_t>& w_shape,
                          const void* w, Problem& problem);

// A dense w of any size M: [M, M] shared or [H, M, M] per head (the decoder and
// packed batches take M from w). Sets problem.per_head_mixing and problem.blocks.
void check_square_mixing_shape(const char* fn, const std::vector<int64_t>& w_shape, const void* w,
                               Problem& problem);

// Adds the layout and the mixing matrix's shape to the problem.
void check_layout_and_mixing_shape(const char* fn, const Options& options,
                                   const std::vector<int64_t>& w_shape, const void* w,
                                   Problem& problem);

// Whether values[0, n) are all finite, and non-negative when `normalize`: one
// branch-free pass over the values' bit patterns, which the compiler
// vectorises (its float compares it left scalar). Exponent bits all set: not
// finite; above the sign bit alone: below zero (-0 passes, as -0 < 0 is
// false). (Element by element with the message's search, the check was a
// visible part of a forward+backward on one thread.)
template <typename T>
bool mixing_values_pass(const T* values, int64_t n, bool normalize) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits kSign = Bits(1) << (8 * sizeof(Bits) - 1);
  constexpr Bits kExponent = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
  const Bits largest = normalize ? kSign : ~Bits(0);
  Bits failed = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Bits bits = std::bit_cast<Bits>(values[j]);
    failed |= Bits((bits & kExponent) == kExponent) | Bits(bits > largest);
  }
  return failed == 0;
}

// Normalized mode divides by mixed key sums; a negative weight could make them
// vanish, so it is refused. Only the entries the mode reads are checked: the
// top-left mixing_blocks x mixing_blocks of a dense w.
template <typename T>
void check_mixing_values(const char* fn, const Problem& problem, const T* w) {
  const int64_t m = problem.mixing_blocks, stride = problem.w_stride;
  const int64_t length = problem.toeplitz_length;
  const int64_t count = problem.per_head_mixing ? problem.heads : 1;
  for (int64_t h = 0; h < count; ++h) {
    // "w[h, i, b]" per head, "w[i, b]" shared (Toeplitz: "w[h, d]", "w[d]").
    const std::string head = problem.per_head_mixing ? std::to_string(h) + ", " : "";
    // Builds the message only on failure: validation runs on every call.
    const auto check = [&](T value, auto index) {
      if (std::isfinite(value) && !(problem.normalize && value < T(0))) return;
      const std::string where = "w[" + head + index() + "]";
      if (!std::isfinite(value)) fail(fn, where + " is not finite (" + std::to_string(value) + ")");
      fail(fn, where + " = " + std::to_string(value) +
                   " is negative; the normalized mode needs non-negative mixing weights "
                   "(use normalize = false, or keep w non-negative)");
    };
    if (problem.toeplitz) {
      const T* diagonals = w + h * (length + 1);
      if (mixing_values_pass(diagonals, length + 1, problem.normalize)) continue;
      for (int64_t d = 0; d <= length; ++d) check(diagonals[d], [&] { return std::to_string(d); });
      continue;
    }
    for (int64_t i = 0; i < m; ++i) {
      const T* row = w + (h * stride + i) * stride;
      const int64_t n = problem.lower_triangular() ? i + 1 : m;
      if (mixing_values_pass(row, n, problem.normalize)) continue;
      for (int64_t b = 0; b < n; ++b)
        check(row[b], [&] { return std::to_string(i) + ", " + std::to_string(b); });
    }
  }
}

}  // namespace mhla::detail

namespace mhla::detail {

// Full validation of an MHLA call's inputs; returns the problem the kernels run.
// (bfloat16 q, k, v come with a float w.)
template <typename T, typename W>
Problem validate_mhla(const char* fn, const Options& options, const TensorView<const T>& q,
                      const TensorView<const T>& k, const TensorView<const T>& v,
                      const TensorView<const W>& w, Device call_device = Device::cpu) {
  const AttentionDims dims = check_qkv(fn, q, k, v, call_device);
  check_device(fn, "w", w.device, call_device);
  Problem problem = check_linear_options(fn, options, dims);
  check_layout_and_mixing_shape(fn, options, w.shape, w.data, problem);
  if (call_device != Device::cpu && device_execution().checks == DeviceChecks::deferred)
    problem.checks_on_device = true;
  else
    check_mixing_values(fn, problem, HostCopy(w).data());
  return problem;
}

// An output or gradient buffer: non-null, exactly the expected shape.
template <typename T>
void check_output(const char* fn, const char* name, const TensorView<T>& t,
                  const std::vector<int64_t>& expected, Device call_device = Device::cpu) {
  check_device(fn, name, t.device, call_device);
  // The common case without building the hint; `expected` comes from
  // validated sizes, so a match with a non-null pointer passes every check.
  if (t.data != nullptr && t.shape == expected) return;
  check_tensor(fn, name, t.data, t.shape, expected.size(), shape_to_string(expected).c_str());
  check_shape_equals(fn, name, t.shape, expected, "");
}

inline std::vector<int64_t> q_shape(const AttentionDims& d);
inline std::vector<int64_t> v_shape(const AttentionDims& d);

// The upstream gradient and the gradient buffers of a backward call.
template <typename T, typename U>
void check_gradients(const char* fn, const AttentionDims& d, const TensorView<const T>& grad_o,
                     const TensorView<U>& grad_q, const TensorView<U>& grad_k,
                     const TensorView<U>& grad_v, Device call_device = Device::cpu) {
  check_output(fn, "grad_o", grad_o, v_shape(d), call_device);
  check_output(fn, "grad_q", grad_q, q_shape(d), call_device);
  check_output(fn, "grad_k", grad_k, q_shape(d), call_device);
  check_output(fn, "grad_v", grad_v, v_shape(d), call_device);
}

inline std::vector<int64_t> q_shape(const AttentionDims& d) {
  return {d.batch, d.tokens, d.heads, d.dk};
}
inline std::vector<int64_t> v_shape(const AttentionDims& d) {
  return {d.batch, d.tokens, d.heads, d.dv};
}

}  // namespace mhla::detail
