// Unit tests of the run directory: torchrun's layout, a temp dir that leaves nothing behind, a
// --log_dir that stays, and reading back error files.
#include "catch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "scratch_dir.h"
#include "workers/run_directory.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

using Scratch = launcher_test::ScratchDir;

}  // namespace

TEST_CASE("run_directory: torchrun's attempt_N/LOCAL_RANK layout, flat in the temp dir", "[run_directory]") {
  const RunLayout log_dir{"logs", true};
  CHECK(log_dir.worker_dir(2, 3) == "logs/attempt_2/3");
  CHECK(log_dir.error_file(0, 1) == "logs/attempt_0/1/error.json");
  CHECK(log_dir.flight_recorder_dir(2) == "logs/attempt_2/flight_recorder");
  CHECK(log_dir.nccl_trace_dir(2) == "logs/attempt_2/nccl_flight_recorder");
  CHECK(log_dir.diagnosis_file(2) == "logs/attempt_2/diagnosis.json");
  const RunLayout temp{"/tmp/cpprun-x", false};
  CHECK(temp.error_file(1, 3) == "/tmp/cpprun-x/attempt_1.3.error.json");
  CHECK(temp.flight_recorder_dir(1) == "/tmp/cpprun-x/attempt_1.flight_recorder");
  CHECK(temp.nccl_trace_dir(1) == "/tmp/cpprun-x/attempt_1.nccl_flight_recorder");
  CHECK(temp.diagnosis_file(1).empty());  // the temp dir goes away: the console has the diagnosis
}

TEST_CASE("run_directory: under a relative --log_dir the dump dirs are absolute, the error file relative as torchrun's",
          "[run_directory]") {
  // A worker that changes directory (Hydra's chdir) must still dump where the diagnosis looks.
  const RunLayout relative{"logs/job_abc", true, "/tmp/cpprun-x", true, "/home/u/exp"};
  CHECK(relative.flight_recorder_dir(2) == "/home/u/exp/logs/job_abc/attempt_2/flight_recorder");
  CHECK(relative.nccl_trace_dir(2) == "/home/u/exp/logs/job_abc/attempt_2/nccl_flight_recorder");
  CHECK(relative.error_file(0, 1) == "logs/job_abc/attempt_0/1/error.json");  // torchrun (Python 3.11)'s path
  CHECK(relative.worker_dir(0, 1) == "logs/job_abc/attempt_0/1");
  const RunLayout absolute{"/var/log/job_abc", true, "", true, "/home/u/exp"};  // start_dir unused
  CHECK(absolute.flight_recorder_dir(0) == "/var/log/job_abc/attempt_0/flight_recorder");

  Scratch scratch;
  const std::string here = std::filesystem::current_path().string();
  const std::string log_dir = std::filesystem::relative(scratch.path + "/logs", here).string();
  REQUIRE(log_dir.front() != '/');
  const RunLayout planned = RunLayout::planned(log_dir, "job7", false);
  CHECK(planned.start_dir == here);
  CHECK(planned.nccl_trace_dir(0) == here + "/" + log_dir + "/job7_XXXXXXXX/attempt_0/nccl_flight_recorder");
  const RunDirectory dir(log_dir, "job7", false);
  CHECK_THAT(dir.layout().error_file(0, 0), StartsWith(log_dir + "/job7_"));
  CHECK(dir.layout().flight_recorder_dir(0) == here + "/" + dir.layout().dir + "/attempt_0/flight_recorder");
  CHECK(RunLayout::planned(scratch.path, "job7", false).start_dir.empty());
}

TEST_CASE("run_directory: a relative TMPDIR is made absolute, as Python's gettempdir() makes it", "[run_directory]") {
  Scratch scratch;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  const std::string relative = std::filesystem::relative(scratch.path, std::filesystem::current_path()).string();
  setenv("TMPDIR", (relative + "/").c_str(), 1);
  const std::string root = temp_root();
  if (saved != nullptr) setenv("TMPDIR", saved_value.c_str(), 1); else unsetenv("TMPDIR");
  CHECK(root.front() == '/');
  CHECK(root.back() != '/');
  CHECK(std::filesystem::equivalent(root, scratch.path));
}

TEST_CASE("run_directory: without --log_dir, a temp dir under TMPDIR that is removed", "[run_directory]") {
  Scratch scratch;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("TMPDIR", scratch.path.c_str(), 1);
  std::string path;
  {
    const RunDirectory dir("", "job", false);
    path = dir.layout().dir;
    CHECK_THAT(path, StartsWith(scratch.path + "/cpprun-"));
    CHECK_FALSE(dir.layout().per_worker_dirs);
    dir.prepare_attempt(0, 2);
    std::ofstream(dir.layout().error_file(0, 1)) << "{}";  // a worker that failed
    CHECK(exists(dir.layout().error_file(0, 1)));
    // The attempt's dumps start empty: a c10d round that reuses the attempt number sees none of the last's.
    // (The workers' library creates the dir: a job without it leaves torchrun's tree exactly.)
    CHECK_FALSE(exists(dir.layout().flight_recorder_dir(0)));
    REQUIRE(mkdir(dir.layout().flight_recorder_dir(0).c_str(), 0700) == 0);
    const std::string dump = dir.layout().flight_recorder_dir(0) + "/rank_1.json";
    std::ofstream(dump) << "{}";
    CHECK(exists(dump));
    dir.prepare_attempt(0, 2);
    CHECK_FALSE(exists(dump));
  }
  // A TMPDIR that does not exist, or is a file, is passed over for TEMP (then TMP, /tmp, ...), as
  // Python's tempfile.gettempdir() and so torchrun pass it over; cpprun once refused to start.
  const char* saved_temp = std::getenv("TEMP");
  const std::string saved_temp_value = saved_temp != nullptr ? saved_temp : "";
  setenv("TEMP", scratch.path.c_str(), 1);
  for (const std::string unusable : {scratch.path + "/missing", std::string("/etc/hostname")}) {
    INFO(unusable);
    setenv("TMPDIR", unusable.c_str(), 1);
    const RunDirectory dir("", "job", false);
    CHECK_THAT(dir.layout().dir, StartsWith(scratch.path + "/cpprun-"));
  }
  if (saved_temp != nullptr) setenv("TEMP", saved_temp_value.c_str(), 1); else unsetenv("TEMP");
  if (saved != nullptr) setenv("TMPDIR", saved_value.c_str(), 1); else unsetenv("TMPDIR");
  CHECK_FALSE(exists(path));
}

TEST_CASE("run_directory: the temp dir keeps PyTorch's NCCL dumps, and only them; stale ones are removed",
          "[run_directory]") {
  Scratch scratch;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("TMPDIR", scratch.path.c_str(), 1);
  std::string path;
  std::string dump;
  {
    const RunDirectory dir("", "job", false);
    path = dir.layout().dir;
    dir.prepare_attempt(0, 1);
    REQUIRE(mkdir(dir.layout().nccl_trace_dir(0).c_str(), 0700) == 0);
    const std::string stale = dir.layout().nccl_trace_dir(0) + "/rank_0";
    std::ofstream(stale) << "old";
    dir.prepare_attempt(0, 1);  // c10d's next round of attempt 0: not its dumps
    CHECK_FALSE(exists(stale));
    dir.prepare_attempt(1, 1);
    REQUIRE(mkdir(dir.layout().nccl_trace_dir(1).c_str(), 0700) == 0);
    REQUIRE(mkdir(dir.layout().flight_recorder_dir(1).c_str(), 0700) == 0);
    std::ofstream(dir.layout().flight_recorder_dir(1) + "/rank_0.json") << "{}";
    std::ofstream(dir.layout().error_file(1, 0)) << "{}";
    dump = dir.layout().nccl_trace_dir(1) + "/rank_0";
    std::ofstream(dump) << "pickle";
  }
  if (saved != nullptr) setenv("TMPDIR", saved_value.c_str(), 1); else unsetenv("TMPDIR");
  CHECK(exists(dump));
  CHECK_FALSE(exists(path + "/attempt_1.flight_recorder"));
  CHECK_FALSE(exists(path + "/attempt_1.0.error.json"));
  CHECK_FALSE(exists(path + "/attempt_0.nccl_flight_recorder"));
}

TEST_CASE("run_directory: a --log_dir is created with its parents and kept, a RUN_ID_XXXXXXXX dir per run",
          "[run_directory]") {
  Scratch scratch;
  const std::string log_dir = scratch.path + "/a/b";
  std::string run_dir;
  {
    const RunDirectory dir(log_dir, "job7", false);
    run_dir = dir.layout().dir;
    // torchrun's layout: LOG_DIR/<run_id>_<8 of Python mkdtemp's characters>/attempt_N/LOCAL_RANK
    CHECK_THAT(run_dir, StartsWith(log_dir + "/job7_"));
    CHECK(run_dir.size() == (log_dir + "/job7_").size() + 8);
    CHECK(run_dir.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_", log_dir.size() + 6) == std::string::npos);
    CHECK(dir.layout().per_worker_dirs);
    CHECK(dir.made_log_dir().empty());
    dir.prepare_attempt(1, 1);
    // A stale error file (c10d's earlier round of the same attempt) is not this attempt's.
    std::ofstream(dir.layout().error_file(1, 0)) << "stale";
    dir.prepare_attempt(1, 1);
    CHECK_FALSE(exists(dir.layout().error_file(1, 0)));
    // A second run with the same id gets a directory of its own.
    const RunDirectory again(log_dir, "job7", false);
    CHECK(again.layout().dir != run_dir);
  }
  CHECK(exists(run_dir + "/attempt_1/0"));
  CHECK(RunLayout::planned(log_dir, "job7", false).dir == log_dir + "/job7_XXXXXXXX");
}

TEST_CASE("run_directory: files without --log_dir go to a torchelastic_ temp dir that stays", "[run_directory]") {
  Scratch scratch;
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("TMPDIR", scratch.path.c_str(), 1);
  std::string made;
  {
    const RunDirectory dir("", "job", true);
    made = dir.made_log_dir();
    CHECK_THAT(made, StartsWith(scratch.path + "/torchelastic_"));
    CHECK_THAT(dir.layout().dir, StartsWith(made + "/job_"));
    CHECK(dir.layout().per_worker_dirs);
    dir.prepare_attempt(0, 1);
  }
  if (saved != nullptr) setenv("TMPDIR", saved_value.c_str(), 1); else unsetenv("TMPDIR");
  CHECK(exists(made));
}

TEST_CASE("run_directory: an unusable --log_dir names itself", "[run_directory]") {
  Scratch scratch;
  std::ofstream(scratch.path + "/file") << "x";
  REQUIRE_THROWS_WITH(RunDirectory(scratch.path + "/file/sub", "none", false),
                      Contains("--log_dir=" + scratch.path + "/file/sub") && Contains("cannot create"));
}

TEST_CASE("run_directory: error files are read up to a limit", "[run_directory]") {
  Scratch scratch;
  const std::string file = scratch.path + "/error.json";
  CHECK_FALSE(read_file_head(file, 10).has_value());
  std::ofstream(file) << "0123456789abc";
  CHECK(read_file_head(file, 100).value() == "0123456789abc");
  CHECK_THAT(read_file_head(file, 10).value(), StartsWith("0123456789\n") && Contains("cut at 10 bytes"));
  // A worker may leave a FIFO (or a link to one) there: not read, and the launcher does not block.
  const std::string fifo = scratch.path + "/fifo.json";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(read_file_head(fifo, 10).has_value());
  REQUIRE(symlink(fifo.c_str(), (scratch.path + "/link.json").c_str()) == 0);
  CHECK_FALSE(read_file_head(scratch.path + "/link.json", 10).has_value());
}

TEST_CASE("run_directory: --log_dir=/dev/null writes no files and gives the workers no error file, as torchrun",
          "[run_directory]") {
  // torchrun's DefaultLogsSpecs.reify: TORCHELASTIC_ERROR_FILE="" for every worker, no run dir.
  const RunLayout planned = RunLayout::planned("/dev/null", "job7", true);
  CHECK_FALSE(planned.per_worker_dirs);
  CHECK(planned.error_file(0, 1).empty());
  std::string made;
  {
    const RunDirectory dir("/dev/null", "job7", false);
    made = dir.layout().dir;
    CHECK(made.rfind("/dev/null", 0) != 0);
    CHECK(dir.layout().error_file(0, 0).empty());
    dir.prepare_attempt(0, 2);
  }
  CHECK_FALSE(exists(made));  // cpprun's own temp dir, removed
}
