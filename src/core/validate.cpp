#include "core/validate.hpp"

#include <cstdio>

#include "mhla/layout.hpp"

namespace mhla::detail {

void fail(const char* fn, const std::string& message) {
  throw Error(std::string(fn) + ": " + message);
}

std::string format_number(double x) {
  // A NaN's sign bit depends on the instructions that made it, not on the
  // input: printed without it, every path and build words the error alike.
  if (std::isnan(x)) return "nan";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", x);
  return text;
}

void check_tensor(const char* fn, const char* name, const void* data,
                  const std::vector<int64_t>& shape, size_t rank, const char* layout_hint) {
  if (shape.size() != rank)
    fail(fn, std::string(name) + " must have rank " + std::to_string(rank) + " " + layout_hint +
                 ", got shape " + shape_to_string(shape));
  for (int64_t extent : shape)
    if (extent <= 0)
      fail(fn, std::string(name) + " has shape " + shape_to_string(shape) +
                   "; every extent must be positive " + layout_hint);
  checked_product(shape, [&] {
    return std::string(fn) + ": " + name + " has shape " + shape_to_string(shape) +
           " whose element count";
  });
  if (data == nullptr) fail(fn, std::string(name) + " is a null pointer");
}

void check_shape_equals(const char* fn, const char* name, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& expected, const char* layout_hint) {
  if (shape != expected)
    fail(fn, std::string(name) + " has shape " + shape_to_string(shape) + ", expected " +
                 shape_to_string(expected) +
                 (*layout_hint ? std::string(" ") + layout_hint : std::string()));
}

AttentionDims check_qkv(const char* fn, const void* q, const std::vector<int64_t>& q_shape,
                        const void* k, const std::vector<int64_t>& k_shape, const void* v,
                        const std::vector<int64_t>& v_shape) {
  check_tensor(fn, "q", q, q_shape, 4, "[B, N, H, Dk]");
  check_tensor(fn, "k", k, k_shape, 4, "[B, N, H, Dk]");
  check_tensor(fn, "v", v, v_shape, 4, "[B, N, H, Dv]");
  check_shape_equals(fn, "k", k_shape, q_shape, "(k must match q: [B, N, H, Dk])");
  const std::vector<int64_t> v_expected = {q_shape[0], q_shape[1], q_shape[2], v_shape[3]};
  check_shape_equals(fn, "v", v_shape, v_expected, "(v must share B, N, H with q: [B, N, H, Dv])");
  return {q_shape[0], q_shape[1], q_shape[2], q_shape[3], v_shape[3]};
}

void check_device(const char* fn, const char* name, Device device, Device call_device) {
  if (device == call_device) return;
  const std::string where = std::string(name) + " is on the " + to_string(device) + " device";
  if (call_device != Device::cpu)
    fail(fn, where + " but q is on the " + to_string(call_device) +
                 " device; pass every tensor of the call on one device");
  if (has_backend(device))
    fail(fn, where + ", but this call runs on the CPU; pass CPU memory (on " + to_string(device) +
                 ", mhla::forward and mhla::backward take every tensor of a call there)");
  fail(fn, where + ", but this build of mhla has only the CPU backend; pass CPU memory");
}

Problem check_linear_options(const char* fn, const LinearAttentionOptions& options,
                             const AttentionDims& dims) {
  Problem problem;
  static_cast<AttentionDims&>(problem) = dims;
  problem.causal = options.masking == Masking::causal;
  problem.block_causal = options.masking == Masking::block_causal;
  problem.phi = options.feature_map;
  problem.normalize = options.normalize;
  if (!(options.eps >= 0.0) || !std::isfinite(options.eps))
    fail(fn, "options.eps must be finite and >= 0, got " + std::to_string(options.eps));
  problem.eps = options.eps;
  problem.scale = options.scale.value_or(1.0 / std::sqrt(double(dims.dk)));
  if (!std::isfinite(problem.scale))
    fail(fn, "options.scale must be finite, got " + std::to_string(problem.scale));
  if (options.scale && options.normalize)
    fail(fn,
         "options.scale applies to the unnormalized mode only; set normalize = false or "
         "leave scale unset");
  return problem;
}

void check_layout_tokens(const char* fn, const TokenLayout& layout, int64_t tokens) {
  if (layout.empty())
    fail(fn, "options.layout is not set; use TokenLayout::sequence, grid2d or grid3d");
  if (layout.num_tokens() != tokens)
    fail(fn, "options.layout (" + layout.describe() + ") has " +
                 std::to_string(layout.num_tokens()) +
                 " tokens but q has N = " + std::to_string(tokens));
}

void check_toeplitz_shape(const char* fn, Masking masking, const std::vector<int64_t>& w_shape,
                          const void* w, Problem& problem) {
  if (masking == Masking::none)
    fail(fn,
         "Toeplitz mixing W[i, b] = w[min(i - b, L)] needs causal or block_causal masking "
         "(it defines b <= i only); use MixingForm::dense for masking none");
  if (w_shape.size() == 1) {
    check_tensor(fn, "w", w, w_shape, 1, "[L + 1]");
    problem.per_head_mixing = false;
  } else if (w_shape.size() == 2) {
    check_tensor(fn, "w", w, w_shape, 2, "[H, L + 1]");
    check_shape_equals(
        fn, "w", w_shape, {problem.heads, w_shape[1]},
        ("(per-head Toeplitz [H, L + 1] with H = " + std::to_string(problem.heads) + ")").c_str());
    problem.per_head_mixing = true;
  } else {
    fail(fn,
         "Toeplitz w must have shape [L + 1] or [H, L + 1] (distances 0..L-1, then the "
         "tail), got " +
             shape_to_string(w_shape));
  }
  problem.toeplitz = true;
  problem.toeplitz_length = w_shape.back() - 1;
}

void check_square_mixing_shape(const char* fn, const std::vector<int64_t>& w_shape, const void* w,
                               Problem& problem) {
  if (w_shape.size() != 2 && w_shape.size() != 3)
    fail(fn, "w must have shape [M, M] or [H, M, M], got " + shape_to_string(w_shape));
  check_tensor(fn, "w", w, w_shape, w_shape.size(), w_shape.size() == 2 ? "[M, M]" : "[H, M, M]");
  problem.per_head_mixing = w_shape.size() == 3;
  problem.blocks = w_shape.back();
  const int64_t m = problem.blocks;
  problem.mixing_blocks = problem.w_stride = m;
  const std::vector<int64_t> square = problem.per_head_mixing
                                          ? std::vector<int64_t>{problem.heads, m, m}
                                          : std::vector<int64_t>{m, m};
  check_shape_equals(fn, "w", w_shape, square, "(square per head)");
}

void check_layout_and_mixing_shape(const char* fn, const Options& options,
                                   const std::vector<int64_t>& w_shape, const void* w,
                                   Problem& problem) {
  const TokenLayout& layout = options.layout;
  check_layout_tokens(fn, layout, problem.tokens);
  if (problem.causal && layout.rank() != 1)
    fail(fn, "causal masking needs a 1D layout, got " + layout.describe());
  problem.layout = &layout;
  problem.blocks = layout.num_blocks();
  problem.cuda_bf16_state = options.cuda.bf16_state;
  problem.cuda_float16_tensor_cores = options.cuda.float16_tensor_cores;
  problem.cuda_float32_tensor_cores = options.cuda.float32_tensor_cores;
  const int64_t m = problem.blocks;
  problem.mixing_blocks = problem.w_stride = m;
  if (options.mixing == MixingForm::toeplitz) {
    check_toeplitz_shape(fn, options.masking, w_shape, w, problem);
    return;
  }
  if (w_shape.size() == 2) {
    check_tensor(fn, "w", w, w_shape, 2, "[M, M]");
    check_shape_equals(
        fn, "w", w_shape, {m, m},
        ("(M = " + std::to_string(m) + " blocks of " + layout.describe() + ")").c_str());
    problem.per_head_mixing = false;
  } else if (w_shape.size() == 3) {
    check_tensor(fn, "w", w, w_shape, 3, "[H, M, M]");
    check_shape_equals(fn, "w", w_shape, {problem.heads, m, m},
                       ("(per-head [H, M, M] with H = " + std::to_string(problem.heads) +
                        " and M = " + std::to_string(m) + " blocks of " + layout.describe() + ")")
                           .c_str());
    problem.per_head_mixing = true;
  } else {
    fail(fn, "w must have shape [M, M] or [H, M, M] with M = " + std::to_string(m) + ", got " +
                 shape_to_string(w_shape));
  }
}

}  // namespace mhla::detail
