// The examples' one shared helper: a command-line flag's value as a number, checked. Kept apart so
// that each example reads top to bottom without three copies of it.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>

namespace examples {

// std::stoi alone would accept "12abc" or fail saying only "stoi".
template <typename T>
T number(const std::string& flag, const std::string& text, T lowest) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw std::invalid_argument(flag + " needs a number, got '" + text + "' (see --help)");
  }
  if (!(value >= lowest)) {
    std::ostringstream message;
    message << flag << " must be at least " << lowest << ", got " << text;
    throw std::invalid_argument(message.str());
  }
  return value;
}

}  // namespace examples
