#pragma once
// The tally of a front-end fuzzing pass: how many calls succeeded (and matched
// the reference), how many ended in a named error, by kind of input, and the
// failures, each printed with the seed that reproduces it.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "random_call.hpp"

namespace mhla::fuzz {

class Outcomes {
 public:
  explicit Outcomes(std::string front_end) : front_end_(std::move(front_end)) {}

  void success(const std::string& kind) { ++successes_[kind]; }

  // A named error is right for a flawed call, for a stale one when it names
  // the state, and for a consistent one only when its result is not
  // representable (the operator's finiteness guarantee).
  void named_error(const RandomCall& c, const std::string& message) {
    if (message.empty()) return failure(c.describe() + ": error without a message");
    if (!c.flaw.empty()) {
      ++errors_[c.flaw];
      return;
    }
    if (!c.stale.empty() && message.find("filled state") != std::string::npos) {
      ++errors_[c.stale];
      return;
    }
    if (message.find("is not finite although every input is finite") != std::string::npos) {
      ++errors_["consistent, result not representable"];
      return;
    }
    failure(c.describe() + ": consistent call refused: " + message);
  }

  void failure(const std::string& what) {
    std::fprintf(stderr, "FAILURE %s\n", what.c_str());
    failures_.push_back(what);
  }

  // Prints the tally; returns the process exit code.
  int report() const {
    int ok = 0, named = 0;
    for (const auto& [kind, n] : successes_) ok += n;
    for (const auto& [kind, n] : errors_) named += n;
    const int total = ok + named + int(failures_.size());
    std::printf(
        "%s fuzzing: %d cases: %d succeeded and matched the reference, %d named errors, %zu "
        "failures\n",
        front_end_.c_str(), total, ok, named, failures_.size());
    for (const auto& [kind, n] : successes_)
      std::printf("  success       %-40s %d\n", kind.c_str(), n);
    for (const auto& [kind, n] : errors_)
      std::printf("  named error   %-40s %d\n", kind.c_str(), n);
    return failures_.empty() ? 0 : 1;
  }

 private:
  std::string front_end_;
  std::map<std::string, int> successes_, errors_;
  std::vector<std::string> failures_;
};

}  // namespace mhla::fuzz
