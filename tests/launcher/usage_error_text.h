// The launcher unit tests' way to read a refusal: the message of the UsageError an action throws.
#pragma once

#include "catch.h"

#include <string>
#include <utility>

#include "command_line/launch_config.h"  // UsageError

namespace cpprun::launcher {

// Runs `action` and returns what its UsageError says; fails the test case when it throws none.
template <typename Action>
std::string usage_error_text(Action&& action) {
  try {
    std::forward<Action>(action)();
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a UsageError");
  return {};
}

}  // namespace cpprun::launcher
