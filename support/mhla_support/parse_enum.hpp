#pragma once
// The inverse of an enum's to_string, for option names on command lines and in
// bindings: an unknown name is an mhla::Error that lists the valid ones
// ("unknown masking 'x'; expected none, causal or block_causal").
#include <initializer_list>
#include <string>

#include "mhla/error.hpp"

namespace mhla::detail {

// to_string(e) is found by argument-dependent lookup in the enum's namespace.
template <typename Enum>
Enum parse_enum(const std::string& name, const char* what, std::initializer_list<Enum> values) {
  std::string expected;
  size_t i = 0;
  for (Enum e : values) {
    if (name == to_string(e)) return e;
    if (i > 0) expected += i + 1 == values.size() ? " or " : ", ";
    expected += to_string(e);
    ++i;
  }
  std::string message = "unknown ";
  message.append(what).append(" '").append(name).append("'; expected ").append(expected);
  throw Error(message);
}

}  // namespace mhla::detail
