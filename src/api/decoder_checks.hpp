#pragma once
// The streaming decoder's checks of its options, w and each call's tokens, as
// functions of shapes (and w's values where given), so that mhla::Decoder and
// the Python package's decoder in torch tensors name a problem in the same
// words: both call these.
#include <cstdint>
#include <string>
#include <vector>

#include "core/validate.hpp"
#include "mhla/decoder.hpp"

namespace mhla::detail {

// The options as the operator's: causal linear attention with the decoder's
// read-out.
LinearAttentionOptions decoder_as_linear(const DecoderOptions& options);

// The constructor's checks: positive sizes, a state whose size fits, the
// operator's own checks of eps, scale and w's shape, and w's values when
// w_values is not null.
DecoderMixing check_decoder(const char* fn, const DecoderOptions& options,
                            const std::vector<int64_t>& w_shape, const float* w_values,
                            Device w_device = Device::cpu);

// "4096 tokens (w is 64x64 for blocks of 64)"; Toeplitz mixing has no limit.
int64_t decoder_context(const DecoderOptions& options, const DecoderMixing& mixing);
std::string decoder_context_description(const DecoderOptions& options, const DecoderMixing& mixing);

void check_decoder_sequence(const char* fn, const DecoderOptions& options, int64_t seq);

// prefill's checks of an empty sequence `seq` at `position` and its prompt.
AttentionDims check_decoder_prefill(const char* fn, const DecoderOptions& options,
                                    const DecoderMixing& mixing, int64_t seq, int64_t position,
                                    const void* q, const std::vector<int64_t>& q_shape,
                                    const void* k, const std::vector<int64_t>& k_shape,
                                    const void* v, const std::vector<int64_t>& v_shape);

// step's checks of one token per sequence and each sequence's room.
void check_decoder_step(const char* fn, const DecoderOptions& options, const DecoderMixing& mixing,
                        const std::vector<int64_t>& positions, const void* q,
                        const std::vector<int64_t>& q_shape, const void* k,
                        const std::vector<int64_t>& k_shape, const void* v,
                        const std::vector<int64_t>& v_shape);

}  // namespace mhla::detail
