// Helpers shared by the unit tests.
#pragma once

#include <string>

#include "core/check.h"

namespace test_util {

// The message of the core::Error that `fn` throws, or "(no error)" when it returns normally.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace test_util
