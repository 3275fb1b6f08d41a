// What a call throws, as text, for tests that check a refusal's message: e.what(), or
// "(no error)" when the call returns.
#pragma once

#include <exception>
#include <functional>
#include <string>

inline std::string error_text_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}
