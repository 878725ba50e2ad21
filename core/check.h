// ENGINE_CHECK: an invariant or input check that throws core::Error naming the place it failed.
#pragma once

#include <stdexcept>
#include <string>

namespace core {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace core

#define ENGINE_CHECK(cond, message)                                  \
  do {                                                               \
    if (!(cond)) ::core::throw_error(__FILE__, __LINE__, (message)); \
  } while (0)

#define ENGINE_FAIL(message) ::core::throw_error(__FILE__, __LINE__, (message))
