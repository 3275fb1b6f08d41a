// What the multi-rank checkpoint tests share (test_optimizer_state_dict.cpp,
// test_pipeline_checkpoint.cpp): a directory's contents, and a save made to fail on one file.
#pragma once

#include "catch.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include "cpprun/collectives.h"
#include "dist_test_support.h"

namespace dist_test {

// Every file in DIR and its bytes.
inline std::map<std::string, std::string> directory_contents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    out[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// `save` cannot write DIR/NAME (a directory stands where its temporary file NAME.tmp goes): it
// fails on every rank, and DIR is left as `saved` (rank 0's contents of it before), byte for byte.
// A rank that heard the failure from another names the rank that raised it once, however many
// ranks relayed it (a pipeline's stage owners, then each owner's team). Collective.
inline void check_blocked_save_changes_nothing(const std::string& dir, const std::string& name,
                                               const std::function<void()>& save,
                                               const std::map<std::string, std::string>& saved) {
  const std::filesystem::path blocked = std::filesystem::path(dir) / (name + ".tmp");
  const int rank = group().rank();
  if (rank == 0) std::filesystem::create_directories(blocked / "in_the_way");
  cpprun::barrier(group());
  std::string error;
  try {
    save();
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(!error.empty());
  const auto raised_on = error.find("(raised on rank ");
  CHECK((raised_on == std::string::npos || error.find("(raised on rank ", raised_on + 1) == std::string::npos));
  cpprun::barrier(group());
  if (rank == 0) {
    std::filesystem::remove_all(blocked);
    CHECK(directory_contents(dir) == saved);
  }
  cpprun::barrier(group());
}

}  // namespace dist_test
