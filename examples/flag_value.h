// The examples' one shared helper: their command-line flags, read one by one, and a flag's value
// as a number, checked. Kept apart so that each example reads top to bottom without three copies.
//
//   for (examples::Flags flags(argc, argv, "train_mlp"); flags.next();) {
//     if (flags.is("--steps")) o.steps = flags.number(1);
//     else flags.unknown();
//   }
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace examples {

// std::stoi alone would accept "12abc" or fail saying only "stoi".
template <typename T>
T number(const std::string& flag, const std::string& text, T lowest) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) {
    throw std::invalid_argument(flag + " " + text + " is out of range (see --help)");
  }
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw std::invalid_argument(flag + " needs a number, got '" + text + "' (see --help)");
  }
  // from_chars reads "inf" and "nan" as floating-point values: no flag means either.
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) throw std::invalid_argument(flag + " needs a finite number, got '" + text + "'");
  }
  if (!(value >= lowest)) {
    std::ostringstream message;
    message << flag << " must be at least " << lowest << ", got " << text;
    throw std::invalid_argument(message.str());
  }
  return value;
}

// For --help: prints the usage text and returns run()'s exit code, 0.
inline int print_usage(const char* usage) {
  std::printf("%s", usage);
  return 0;
}

// argv's flags in order; a flag that takes a value consumes the argument after it.
class Flags {
 public:
  Flags(int argc, char** argv, std::string program) : argc_(argc), argv_(argv), program_(std::move(program)) {}

  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(const char* name) const { return flag_ == name; }
  const std::string& flag() const { return flag_; }
  // The argument after the flag; a flag last on the line is an error, never silently ignored.
  std::string value() {
    if (i_ + 1 >= argc_) throw std::invalid_argument(flag_ + " needs a value (see --help)");
    return argv_[++i_];
  }
  template <typename T>
  T number(T lowest) {
    return examples::number(flag_, value(), lowest);
  }
  [[noreturn]] void unknown() const {
    throw std::invalid_argument("unknown option " + flag_ + " (" + program_ + " --help lists them)");
  }

 private:
  int argc_;
  char** argv_;
  std::string program_;
  int i_ = 0;
  std::string flag_;
};

}  // namespace examples
