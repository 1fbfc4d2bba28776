#pragma once
// Every invalid argument reaching the public API becomes an mhla::Error whose
// message names the function, the argument, what was expected and what was given.
#include <stdexcept>
#include <string>

namespace mhla {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace mhla
