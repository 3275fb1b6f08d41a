// A private scratch directory for one launcher test case, removed with everything in it when the
// case ends (also when a check fails).
#pragma once

#include "catch.h"

#include <stdlib.h>

#include <cstdlib>
#include <string>

namespace launcher_test {

struct ScratchDir {
  std::string path;
  ScratchDir() {
    char pattern[] = "/tmp/cpprun-unit.XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~ScratchDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

}  // namespace launcher_test
