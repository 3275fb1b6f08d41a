// The job secret where the user gives none (common/host_secret.h, Note [A job on one host]): which
// jobs get one by themselves, that agents of one job on this host read the same one, and that a
// folder or file another user could reach is refused.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "catch.h"
#include "common/errors.h"
#include "common/host_secret.h"
#include "common/job_secret.h"
#include "scratch_dir.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("host_secret: which jobs make or share a secret when none is given", "[host_secret]") {
  JobSecretOptions o;
  o.multi_node = true;
  o.max_nodes = 2;
  o.endpoint_host = "127.0.0.1";
  CHECK(job_secret_source(o, false) == JobSecretSource::kHostShared);
  CHECK(job_secret_source(o, true) == JobSecretSource::kEnvironment);  // the user's wins
  o.secret_file = "/some/file";
  CHECK(job_secret_source(o, true) == JobSecretSource::kFile);
  o.secret_file.clear();
  o.endpoint_host = "node01";  // a name is not resolved: it may be another host
  CHECK(job_secret_source(o, false) == JobSecretSource::kMissing);
  o.max_nodes = 1;  // one agent: nobody else needs its secret, wherever it listens
  CHECK(job_secret_source(o, false) == JobSecretSource::kOwnRandom);
  o.no_job_secret = true;
  CHECK(job_secret_source(o, false) == JobSecretSource::kNone);
  o.no_job_secret = false;
  o.multi_node = false;
  CHECK(job_secret_source(o, false) == JobSecretSource::kNone);

  CHECK(is_loopback_endpoint_host("localhost"));
  CHECK(is_loopback_endpoint_host("127.0.0.1"));
  CHECK(is_loopback_endpoint_host("127.3.2.1"));
  CHECK(is_loopback_endpoint_host("::1"));
  CHECK_FALSE(is_loopback_endpoint_host("10.0.0.1"));
  CHECK_FALSE(is_loopback_endpoint_host("::ffff:10.0.0.1"));
  CHECK_FALSE(is_loopback_endpoint_host("128.0.0.1"));
  CHECK_FALSE(is_loopback_endpoint_host("localhost.example.com"));
  CHECK_FALSE(is_loopback_endpoint_host(""));

  // $XDG_RUNTIME_DIR only when it is this user's private folder (a stale value from another
  // machine, or a shared one, is passed over): else /tmp/cpprun-UID.
  const std::string fallback = "/tmp/cpprun-" + std::to_string(::geteuid());
  const auto runtime = [](std::string value) {
    return [value](const std::string&) { return std::optional<std::string>(value); };
  };
  const launcher_test::ScratchDir scratch;
  const std::string own = scratch.path + "/run";
  REQUIRE(::mkdir(own.c_str(), 0700) == 0);
  REQUIRE(::chmod(own.c_str(), 0700) == 0);
  CHECK(host_secret_folder(runtime(own)) == own + "/cpprun");
  REQUIRE(::chmod(own.c_str(), 0755) == 0);
  CHECK(host_secret_folder(runtime(own)) == fallback);
  CHECK(host_secret_folder(runtime(scratch.path + "/missing")) == fallback);
  CHECK(host_secret_folder(runtime("relative")) == fallback);
}

TEST_CASE("host_secret: the agents of a job on this host share one secret only this user can read",
          "[host_secret]") {
  const launcher_test::ScratchDir scratch;
  const std::string folder = scratch.path + "/secrets";
  const mode_t umask_before = ::umask(0177);  // the owner's own bits masked: still 0700 and 0600
  const std::string first = shared_host_secret(folder, 29400, "job-a");
  ::umask(umask_before);
  CHECK(first.size() == 64);
  CHECK(first.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(mode_of(folder) == 0700);
  CHECK(shared_host_secret(folder, 29400, "job-a") == first);  // the second agent reads the first's
  CHECK(shared_host_secret(folder, 29401, "job-a") != first);  // another port, another job
  CHECK(shared_host_secret(folder, 29400, "job-b") != first);  // another id, another job
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    ++files;
    CHECK(mode_of(entry.path().string()) == 0600);
    CHECK(entry.path().filename().string().rfind("job-", 0) == 0);  // no temporary left behind
  }
  CHECK(files == 3);

  // Through the command line's options: a one-agent job's secret is its own and never written.
  JobSecretOptions o;
  o.multi_node = true;
  o.max_nodes = 1;
  o.endpoint_host = "10.0.0.1";
  const cpprun::EnvLookup no_env = [](const std::string&) { return std::nullopt; };
  const std::string own = resolve_job_secret(o, no_env);
  CHECK(own.size() == 64);
  CHECK(resolve_job_secret(o, no_env) != own);
  o.max_nodes = 2;
  CHECK_THAT(usage_error_of([&] { resolve_job_secret(o, no_env); }),
             Contains("needs a job secret") && Contains("10.0.0.1 is not this host's loopback"));
}

TEST_CASE("host_secret: a folder or file another user could reach is refused", "[host_secret]") {
  const launcher_test::ScratchDir scratch;
  const std::string open_folder = scratch.path + "/open";
  REQUIRE(::mkdir(open_folder.c_str(), 0755) == 0);
  REQUIRE(::chmod(open_folder.c_str(), 0755) == 0);  // whatever the umask
  CHECK_THAT(usage_error_of([&] { shared_host_secret(open_folder, 1, "x"); }),
             Contains("is not this user's private folder") && Contains("may use it") &&
                 Contains("CPPRUN_JOB_SECRET"));

  const std::string target = scratch.path + "/target";
  REQUIRE(::mkdir(target.c_str(), 0700) == 0);
  const std::string link = scratch.path + "/link";
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  CHECK_THAT(usage_error_of([&] { shared_host_secret(link, 1, "x"); }), Contains("not a folder"));

  // A secret file readable by others (put there by hand) is not believed.
  const std::string folder = scratch.path + "/secrets";
  const std::string secret = shared_host_secret(folder, 5, "y");
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    REQUIRE(::chmod(entry.path().c_str(), 0644) == 0);
  }
  CHECK_THAT(usage_error_of([&] { shared_host_secret(folder, 5, "y"); }),
             Contains("cannot hold this job's secret") && Contains("may use it") && Contains("remove it"));
  // A file cut short (written by hand) is not believed either.
  const std::string path = host_secret_path(folder, 6, "z");
  {
    std::ofstream out(path);
    out << "short";
  }
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  CHECK_THAT(usage_error_of([&] { shared_host_secret(folder, 6, "z"); }),
             Contains("holds 5 bytes") && Contains("remove it"));
}
