#pragma once
// Integer flag checks whose messages say what is wanted in words. CLI11's
// PositiveNumber and NonNegativeNumber print the whole double range instead
// ("Value 0 not in range 0.000000 to 1797693134862315708145274237317..."),
// and a flag like --toeplitz-length used to take -1 for "off", so a negative
// value slipped through silently.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

namespace mhla::tools {

// The value of `text` if it is a whole number written in full ("12", not
// "1.2e1" or "12x"), else nothing.
inline std::optional<int64_t> parse_whole_number(const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size()) return std::nullopt;
  return int64_t(value);
}

// Accepts a whole number >= minimum.
inline CLI::Validator integer_at_least(int64_t minimum, const std::string& what) {
  return CLI::Validator(
      [minimum, what](std::string& text) -> std::string {
        const std::optional<int64_t> value = parse_whole_number(text);
        if (!value || *value < minimum) return "must be " + what + ", got '" + text + "'";
        return "";
      },
      what);
}

inline CLI::Validator positive_integer() { return integer_at_least(1, "a positive integer"); }
inline CLI::Validator non_negative_integer() { return integer_at_least(0, "an integer >= 0"); }

}  // namespace mhla::tools
