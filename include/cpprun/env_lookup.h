// How cpprun reads environment variables: through a lookup, so that every rule that reads one can
// be tested with a map instead of the process environment. Shared by the library (env.h) and the
// launcher (which links no LibTorch, and includes only this header of the library's).
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace cpprun {

// Looks up one environment variable; nullopt when unset. Tests pass a map instead.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (getenv).
inline EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace cpprun
