#pragma once
// How the operator's entry points (api/operator.cpp) use a ForwardState: where
// a forward writes its summaries and mixed summaries, the record it leaves,
// and what a backward reads after checking that record against its call.
#include <cstdint>
#include <utility>
#include <vector>

#include "mhla/forward_state.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla::detail {

// A forward given `state` first empties it: a call that fails leaves no
// state of an earlier one behind.
template <typename S>
void forget_call(ForwardState<S>& state);

// Where a forward on `device` writes the arrays of `state`, each of `shape`
// (saved_summaries_shape() of the validated call): room it makes in the
// state, or the caller's arrays of a state made with ForwardState::over,
// checked against the call.
template <typename S>
std::pair<S*, S*> arrays_to_fill(const char* fn, const std::vector<int64_t>& shape, Device device,
                                 ForwardState<S>& state);

// After a forward that succeeded: the record of its call in `state`.
template <typename S, typename X>
void record_call(const Options& options, const TensorView<const X>& q, const TensorView<const X>& k,
                 const TensorView<const X>& v, const TensorView<const S>& w,
                 const TensorView<const X>& o, ForwardState<S>& state);

// The arrays a backward given `state` reads, once the state's record matches
// the call (an mhla::Error names what differs); a state made with
// ForwardState::over is read as it is.
template <typename S, typename X>
std::pair<const S*, const S*> arrays_to_read(const Options& options, const TensorView<const X>& q,
                                             const TensorView<const X>& k,
                                             const TensorView<const X>& v,
                                             const TensorView<const S>& w,
                                             const TensorView<const X>& o,
                                             const ForwardState<S>& state);

}  // namespace mhla::detail
