#pragma once
// One validated call: the problem the backend runs, with the token layout and
// the block table it points into. Every entry point (operator, phases, packed
// sequences, decoder, linear attention) builds one after its checks, so the
// pairing of a Problem with the table it views is written once, here.
#include <utility>

#include "core/block_table.hpp"
#include "core/validate.hpp"

namespace mhla::detail {

class ValidatedCall {
 public:
  // `problem` has passed its entry point's checks; `layout` arranges its
  // tokens into problem.blocks blocks.
  ValidatedCall(Problem problem, TokenLayout layout)
      : problem_(std::move(problem)), layout_(std::move(layout)), table_(layout_) {
    problem_.layout = &layout_;
    problem_.table = table_.view();
  }
  // Not copied or moved: the problem points into this object.
  ValidatedCall(const ValidatedCall&) = delete;
  ValidatedCall& operator=(const ValidatedCall&) = delete;

  const Problem& problem() const { return problem_; }

 private:
  Problem problem_;
  const TokenLayout layout_;
  const BlockTable table_;
};

}  // namespace mhla::detail
