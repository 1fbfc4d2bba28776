#pragma once
// Memory sized by user input is requested through `allocating`, so that a
// failed request is an mhla::OutOfMemory that names the call, what the memory
// was for and how many bytes it asked, instead of a bare std::bad_alloc far
// from its cause.
#include <new>
#include <stdexcept>
#include <string>

#include "core/validate.hpp"
#include "mhla/error.hpp"

namespace mhla::detail {

template <typename Fn>
decltype(auto) allocating(const char* fn, const std::string& what, double bytes, Fn&& allocate) {
  try {
    return allocate();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  throw OutOfMemory(std::string(fn) + ": cannot allocate " + format_number(bytes) + " bytes (" +
                    format_number(bytes / double(1 << 30)) + " GiB) for " + what);
}

}  // namespace mhla::detail
