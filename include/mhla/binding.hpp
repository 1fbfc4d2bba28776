#pragma once
// What a language binding needs beyond the entry points: the operator's checks
// of a call that read shapes and options alone (and w's values where given),
// and its error texts, for a binding that computes some calls elsewhere (the
// Python package's plain-torch path and its decoder in torch tensors) and must
// refuse bad input, and name a non-finite result, in the operator's words; and
// the CUDA runtime's answers, for a binding that allocates device results.
// Each check throws the mhla::Error that the entry point named by `function`
// would throw. Not needed to call the operator.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mhla/decoder.hpp"
#include "mhla/options.hpp"
#include "mhla/varlen.hpp"

namespace mhla::binding {

using Shape = std::vector<int64_t>;

// forward()'s checks of q, k, v and w's shapes and the options, and of w's
// values (host memory of w_shape; W float or double) where w_values is given.
template <typename W>
void check_call(const char* function, const Options& options, const Shape& q_shape,
                const Shape& k_shape, const Shape& v_shape, const Shape& w_shape,
                const W* w_values);
void check_call(const char* function, const Options& options, const Shape& q_shape,
                const Shape& k_shape, const Shape& v_shape, const Shape& w_shape);

// varlen_forward()'s checks of a packed call's shapes, options and offsets.
void check_varlen_call(const VarlenOptions& options, const Shape& cu_seqlens, const Shape& q_shape,
                       const Shape& k_shape, const Shape& v_shape, const Shape& w_shape);

// mhla::Decoder's checks: its options and w (w's values where given), a
// sequence index, a prefill of the empty sequence `seq` at `position`, and a
// step of one token per sequence at `positions`.
void check_decoder(const DecoderOptions& options, const Shape& w_shape, const float* w_values);
void check_decoder_sequence(const char* function, const DecoderOptions& options, int64_t seq);
void check_decoder_prefill(const DecoderOptions& options, const Shape& w_shape, int64_t seq,
                           int64_t position, const Shape& q_shape, const Shape& k_shape,
                           const Shape& v_shape);
void check_decoder_step(const DecoderOptions& options, const Shape& w_shape,
                        const std::vector<int64_t>& positions, const Shape& q_shape,
                        const Shape& k_shape, const Shape& v_shape);

// "name[i, j, ...] = value" for entry `flat` of a tensor of `shape`.
std::string element_text(const std::string& name, const Shape& shape, int64_t flat, double value);

// The operator's error texts, each starting with `function`: a result that
// is not finite although every input is (`what` names the entry, or is empty
// for the read-out's denominator; magnitudes: (input, max |value|)); a float16
// result beyond float16's range; a softmax whose scores overflow `type`.
std::string non_finite_message(const std::string& function, const std::string& what,
                               const std::vector<std::pair<std::string, double>>& magnitudes,
                               const Options& options, int64_t dk, const std::string& type);
std::string float16_range_message(const std::string& function, const std::string& element,
                                  const std::string& remedy);
std::string softmax_overflow_message(const std::string& function,
                                     const std::vector<std::pair<std::string, double>>& magnitudes,
                                     double scale, const std::string& type);

// Whether this build has the CUDA backend and a device for it, and if not,
// why not.
bool cuda_device_present();
std::string cuda_absence_reason();

// An mhla::Error naming `what` and the CUDA runtime's reason unless `status`
// (a cudaError_t) is cudaSuccess. In builds without CUDA every status fails.
void check_cuda(int status, const char* what);

}  // namespace mhla::binding
