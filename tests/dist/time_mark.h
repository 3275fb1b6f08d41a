// The time marks the test scripts' bounds start at (tests/launcher/behaviour/common.sh's
// latest_mark): a probe writes one when it reaches its fault, so start-up on a loaded machine is no
// part of what a script bounds.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>

namespace test_marks {

// Writes the Unix time now, in milliseconds, into `file`, whole: written aside, then renamed.
inline void mark_time(const std::filesystem::path& file) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const std::filesystem::path part = file.string() + ".part";
  std::ofstream(part) << std::chrono::duration_cast<std::chrono::milliseconds>(now).count() << "\n";
  std::filesystem::rename(part, file);
}

}  // namespace test_marks
