#pragma once
// What forward() keeps for backward(), owned by the library. The calls that
// fill and read it are in mhla/operator.hpp.
#include <memory>

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
// reads the arrays instead of recomputing them, without the fingerprint
// check that arrays handed in as saved_summaries / saved_mixed get. What the
// record cannot see is a write into q, k, v or o between the two calls (C++
// arrays carry no version counter): the caller keeps them as forward left
// them, as a layer holding its activations does.
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

 private:
  friend struct detail::ForwardStateAccess;
  std::unique_ptr<detail::ForwardRecord<S>> record_;
};

}  // namespace mhla
