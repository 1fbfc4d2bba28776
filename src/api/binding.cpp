// mhla/binding.hpp: the operator's checks and error texts, for bindings, over
// the same functions the entry points call.
#include "mhla/binding.hpp"

#include "mhla/error.hpp"

#include "api/decoder_checks.hpp"
#include "api/varlen_checks.hpp"
#include "backend/backend.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"
#if MHLA_WITH_CUDA
#include "cuda/cuda_check.hpp"
#endif

namespace mhla::binding {
namespace {

// Shapes only: any non-null address passes the checks' pointer tests.
const int kMarker = 0;

detail::Problem checked_shapes(const char* function, const Options& options, const Shape& q_shape,
                               const Shape& k_shape, const Shape& v_shape, const Shape& w_shape) {
  const detail::AttentionDims dims =
      detail::check_qkv(function, &kMarker, q_shape, &kMarker, k_shape, &kMarker, v_shape);
  detail::Problem problem = detail::check_linear_options(function, options, dims);
  detail::check_layout_and_mixing_shape(function, options, w_shape, &kMarker, problem);
  return problem;
}

}  // namespace

template <typename W>
void check_call(const char* function, const Options& options, const Shape& q_shape,
                const Shape& k_shape, const Shape& v_shape, const Shape& w_shape,
                const W* w_values) {
  const detail::Problem problem =
      checked_shapes(function, options, q_shape, k_shape, v_shape, w_shape);
  if (w_values != nullptr) detail::check_mixing_values(function, problem, w_values);
}
template void check_call(const char*, const Options&, const Shape&, const Shape&, const Shape&,
                         const Shape&, const float*);
template void check_call(const char*, const Options&, const Shape&, const Shape&, const Shape&,
                         const Shape&, const double*);

void check_call(const char* function, const Options& options, const Shape& q_shape,
                const Shape& k_shape, const Shape& v_shape, const Shape& w_shape) {
  checked_shapes(function, options, q_shape, k_shape, v_shape, w_shape);
}

void check_varlen_call(const VarlenOptions& options, const Shape& cu_seqlens, const Shape& q_shape,
                       const Shape& k_shape, const Shape& v_shape, const Shape& w_shape) {
  detail::check_varlen_shapes(options, cu_seqlens, q_shape, k_shape, v_shape, w_shape);
}

void check_decoder(const DecoderOptions& options, const Shape& w_shape, const float* w_values) {
  detail::check_decoder("mhla::Decoder", options, w_shape, w_values);
}

void check_decoder_sequence(const char* function, const DecoderOptions& options, int64_t seq) {
  detail::check_decoder_sequence(function, options, seq);
}

void check_decoder_prefill(const DecoderOptions& options, const Shape& w_shape, int64_t seq,
                           int64_t position, const Shape& q_shape, const Shape& k_shape,
                           const Shape& v_shape) {
  detail::check_decoder_prefill("mhla::Decoder::prefill", options,
                                detail::check_decoder("mhla::Decoder", options, w_shape, nullptr),
                                seq, position, &kMarker, q_shape, &kMarker, k_shape, &kMarker,
                                v_shape);
}

void check_decoder_step(const DecoderOptions& options, const Shape& w_shape,
                        const std::vector<int64_t>& positions, const Shape& q_shape,
                        const Shape& k_shape, const Shape& v_shape) {
  detail::check_decoder_step("mhla::Decoder::step", options,
                             detail::check_decoder("mhla::Decoder", options, w_shape, nullptr),
                             positions, &kMarker, q_shape, &kMarker, k_shape, &kMarker, v_shape);
}

std::string element_text(const std::string& name, const Shape& shape, int64_t flat, double value) {
  return detail::element_name(name.c_str(), shape, flat) + " = " + detail::format_number(value);
}

std::string non_finite_message(const std::string& function, const std::string& what,
                               const std::vector<std::pair<std::string, double>>& magnitudes,
                               const Options& options, int64_t dk, const std::string& type) {
  const detail::Problem problem =
      detail::check_linear_options(function.c_str(), options, {1, 1, 1, dk, 1});
  const std::string named = what.empty() ? "the read-out's denominator phi(q)^T z~ + eps" : what;
  return function + ": " + detail::non_finite_message(named, magnitudes, problem, type);
}

std::string float16_range_message(const std::string& function, const std::string& element,
                                  const std::string& remedy) {
  return function + ": " + detail::float16_range_message(element, remedy);
}

std::string softmax_overflow_message(const std::string& function,
                                     const std::vector<std::pair<std::string, double>>& magnitudes,
                                     double scale, const std::string& type) {
  return function + ": " + detail::softmax_overflow_message(magnitudes, scale, type);
}

#if MHLA_WITH_CUDA
bool cuda_device_present() { return backend::cuda_device_present(); }
std::string cuda_absence_reason() { return backend::cuda_absence_reason(); }
void check_cuda(int status, const char* what) {
  cuda::check(static_cast<cudaError_t>(status), what);
}
#else
bool cuda_device_present() { return false; }
std::string cuda_absence_reason() { return "this build has no CUDA backend"; }
void check_cuda(int, const char* what) {
  throw Error(std::string("mhla: ") + what + ": this build has no CUDA backend");
}
#endif

}  // namespace mhla::binding
