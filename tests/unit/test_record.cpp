// cpprun::record: the error file torch's agents read (layout, escaping, type, rank, time), the
// message on stderr and the exit code; nothing written when main succeeds.
#include "catch.h"
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "cpprun/record.h"
#include "scratch_files.h"

namespace fs = std::filesystem;
using scratch::contents;
using scratch::ScratchDir;

namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> saved;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* old = std::getenv(name.c_str())) saved = old;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { saved ? ::setenv(name.c_str(), saved->c_str(), 1) : ::unsetenv(name.c_str()); }
};

// What the process writes on stderr while this lives.
struct CapturedStderr {
  int saved = ::dup(2);
  fs::path file = fs::temp_directory_path() / ("cpprun_record_stderr_" + std::to_string(::getpid()));
  CapturedStderr() {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string text() {
    ::dup2(saved, 2);
    std::ifstream in(file);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
  ~CapturedStderr() {
    ::dup2(saved, 2);
    ::close(saved);
    fs::remove(file);
  }
};

// The raw (still escaped) text of string field "key" in `json`.
std::string field(const std::string& json, const std::string& key) {
  const std::string start = "\"" + key + "\": \"";
  const auto at = json.find(start);
  if (at == std::string::npos) return "<no " + key + ">";
  std::size_t end = at + start.size();
  while (end < json.size() && json[end] != '"') end += json[end] == '\\' ? 2 : 1;
  return json.substr(at + start.size(), end - at - start.size());
}

}  // namespace

TEST_CASE("record: an exception becomes torch's error file, a line on stderr and exit code 1", "[record]") {
  ScratchDir dir("record");
  const fs::path error_file = dir.path / "error.json";
  ScopedEnv file_env("TORCHELASTIC_ERROR_FILE", error_file.string());
  ScopedEnv rank_env("RANK", "3");
  const auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const long long before_ms = now_ms();
  CapturedStderr err;
  const int code = cpprun::record([]() -> int { throw std::invalid_argument("bad \"value\"\\ in\n\x01 caf\xc3\xa9 \xff"); });
  const std::string printed = err.text();
  CHECK(code == 1);
  CHECK(code == cpprun::kRecordedErrorExitCode);
  CHECK(printed.find("error on rank 3: std::invalid_argument: bad \"value\"") != std::string::npos);

  const std::string json = contents(error_file);
  INFO(json);
  // torch.distributed.elastic's layout: message.message, message.extraInfo.{py_callstack,timestamp}
  CHECK(json.find("{\n  \"message\": {\n    \"message\": ") == 0);
  CHECK(json.find("\"extraInfo\": {") != std::string::npos);
  CHECK(json.find("\"py_callstack\": ") != std::string::npos);
  // JSON escapes: quote, backslash, newline, a control byte; UTF-8 kept; a stray byte replaced.
  CHECK(field(json, "message") == "std::invalid_argument: bad \\\"value\\\"\\\\ in\\n\\u0001 caf\xc3\xa9 \\ufffd");
  CHECK(field(json, "rank") == "3");
  // cpprun's own, for the launcher's root cause (launcher_contract.h): milliseconds, read once with
  // torch's whole seconds.
  const long long failed_at_ms = std::stoll(field(json, "cpprun_failed_at_ms"));
  CHECK(failed_at_ms >= before_ms);
  CHECK(failed_at_ms <= now_ms());
  CHECK(std::stoll(field(json, "timestamp")) == failed_at_ms / 1000);
  CHECK_FALSE(fs::exists(error_file.string() + ".tmp"));

  // If python3 is here, the file must be JSON that its json module reads as torch's agent does.
  if (std::system("command -v python3 >/dev/null 2>&1") == 0) {
    const std::string check = "python3 -c 'import json,sys; d=json.load(open(sys.argv[1], encoding=\"utf-8\"));"
                              " m=d[\"message\"]; assert m[\"message\"].startswith(\"std::invalid_argument: bad\");"
                              " int(m[\"extraInfo\"][\"timestamp\"])' " + error_file.string();
    CHECK(std::system(check.c_str()) == 0);
  }
}

TEST_CASE("record: the C++ type is demangled, c10::Error keeps its stack, any thrown type is reported", "[record]") {
  ScratchDir dir("record");
  const fs::path error_file = dir.path / "error.json";
  ScopedEnv file_env("TORCHELASTIC_ERROR_FILE", error_file.string());
  ScopedEnv rank_env("RANK", "0");
  CapturedStderr err;
  CHECK(cpprun::record([] { TORCH_CHECK(false, "the shapes differ: 3 vs 4"); }) == 1);
  std::string json = contents(error_file);
  CHECK(field(json, "message") == "c10::Error: the shapes differ: 3 vs 4");
  CHECK(field(json, "py_callstack").find("Exception raised from") != std::string::npos);

  CHECK(cpprun::record([]() -> int { throw 42; }) == 1);
  json = contents(error_file);
  CHECK(field(json, "message").find("int: (an exception of type int") == 0);
  const std::string printed = err.text();
  CHECK(printed.find("c10::Error: the shapes differ: 3 vs 4") != std::string::npos);
}

TEST_CASE("record: a main that returns is passed through, and no error file is written", "[record]") {
  ScratchDir dir("record");
  const fs::path error_file = dir.path / "error.json";
  ScopedEnv file_env("TORCHELASTIC_ERROR_FILE", error_file.string());
  CHECK(cpprun::record([] { return 7; }) == 7);
  CHECK(cpprun::record([] {}) == 0);
  CHECK_FALSE(fs::exists(error_file));
}

TEST_CASE("record: an error file that cannot be written is reported, and the exit code stays", "[record]") {
  ScopedEnv file_env("TORCHELASTIC_ERROR_FILE", "/nonexistent_cpprun_dir/error.json");
  CapturedStderr err;
  CHECK(cpprun::record([]() -> int { throw std::runtime_error("disk on fire"); }) == 1);
  const std::string printed = err.text();
  INFO(printed);
  CHECK(printed.find("std::runtime_error: disk on fire") != std::string::npos);
  CHECK(printed.find("could not write the error file") != std::string::npos);
  CHECK(printed.find("/nonexistent_cpprun_dir/error.json") != std::string::npos);
}
