#pragma once
// What forward() keeps for backward(), owned by the library. The calls that
// fill and read it are in mhla/operator.hpp.
#include <memory>

#include "mhla/tensor.hpp"

namespace mhla {

namespace detail {
template <typename S>
struct ForwardRecord;  // defined in the library
struct ForwardStateAccess;
}  // namespace detail

// The block summaries [S_b | z_b] and the mixed summaries [S~_i | z~_i] of one
// forward() call, in memory of its tensors' device that the state owns,
// with a record of the call: its options, its tensors' addresses and shapes,
// and w's values. backward() given the state checks the record (the same
// options and tensors, w unchanged; an mhla::Error names what differs) and
// reads the arrays instead of recomputing them. What the record cannot see is
// a write into q, k, v or o between the two calls (C++ arrays carry no
// version counter): the caller keeps them as forward left them, as a layer
// holding its activations does.
//
// S is the state's element type: T for float and double calls, float for
// bfloat16 and float16 ones (a state is read only by a backward on the
// forward's element type). A state is reused: the next forward() it is given
// keeps its arrays when they are large enough. Move-only.
template <typename S>
class ForwardState {
 public:
  ForwardState();
  ForwardState(ForwardState&&) noexcept;
  ForwardState& operator=(ForwardState&&) noexcept;
  ~ForwardState();

  // Whether no forward() has filled it (or the last one given it failed).
  bool empty() const;

  // A state over two arrays the caller owns, each of saved_summaries_shape()
  // on the tensors' device, for a language binding whose runtime keeps
  // forward's results until backward in its own arrays and guards them there
  // (torch autograd's saved tensors and their version counters): forward()
  // writes the summaries and mixed summaries into them, and backward() reads
  // them as they are, with no record to check: that they come from a forward
  // of the same call, with the same w, is the caller's promise.
  static ForwardState over(TensorView<S> summaries, TensorView<S> mixed);

 private:
  friend struct detail::ForwardStateAccess;
  std::unique_ptr<detail::ForwardRecord<S>> record_;
};

}  // namespace mhla
