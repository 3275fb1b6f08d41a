// Files written whole or not at all. write_file_atomically() writes PATH.tmp beside PATH, flushes
// it to the disk (fsync) and renames it over PATH: a crash, a full disk or a killed process leaves
// the old PATH or the new one, never a torn one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cpprun {

// Replaces PATH's contents with `bytes`. On failure removes PATH.tmp, leaves PATH as it was, and
// throws std::system_error whose message names the file and the system's reason
// ("cpprun: cannot write run/checkpoint.pt: No space left on device").
void write_file_atomically(const std::string& path, std::string_view bytes);
// The same for a file of several parts, written one after the other: a large file (a checkpoint)
// written from the memory its parts already occupy, never joined into one buffer first.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts);

}  // namespace cpprun
