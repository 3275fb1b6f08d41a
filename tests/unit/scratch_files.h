// Files for unit tests: a private directory removed afterwards, and a file's bytes.
#pragma once

#include "catch.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace scratch {

// A fresh directory under /tmp named after the test; removed with everything in it.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& test) {
    std::string name = "/tmp/cpprun_" + test + "_XXXXXX";
    REQUIRE(::mkdtemp(name.data()) != nullptr);
    path = name;
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

// The file's bytes, exactly ("" when it cannot be read).
inline std::string contents(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace scratch
