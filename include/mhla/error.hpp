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

// Memory sized by the arguments could not be had; the message names the
// function, what it was for and the bytes requested (Python: MemoryError).
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace mhla
