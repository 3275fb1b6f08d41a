// Unit tests of the stale temp dirs' rules (Note [Stale temp dirs]): when a recorded owner is certainly
// gone, and what reads as a record. Removing them from a real TMPDIR: behaviour/launcher_killed.sh.
#include "catch.h"

#include <unistd.h>

#include <optional>
#include <string>

#include "workers/stale_run_dirs.h"

using namespace cpprun::launcher;

TEST_CASE("stale_run_dirs: an owner is gone only on this boot, in this pid namespace, its pid free or reused",
          "[stale_run_dirs]") {
  const RunDirOwner self{"b00t", "pid:[4026531836]", 100, 5000};
  const RunDirOwner dead{"b00t", "pid:[4026531836]", 42, 1234};
  const auto no_process = [](pid_t) -> std::optional<unsigned long long> { return std::nullopt; };
  const auto started_at = [](unsigned long long t) {
    return [t](pid_t) -> std::optional<unsigned long long> { return t; };
  };
  CHECK(owner_gone(dead, self, no_process));
  CHECK(owner_gone(dead, self, started_at(9999)));        // the pid is another process's now
  CHECK_FALSE(owner_gone(dead, self, started_at(1234)));  // alive
  RunDirOwner other = dead;
  other.boot_id = "another machine or boot";
  CHECK_FALSE(owner_gone(other, self, no_process));
  other = dead;
  other.pid_namespace = "pid:[4026532999]";  // a container sharing /tmp
  CHECK_FALSE(owner_gone(other, self, no_process));
  CHECK_FALSE(owner_gone(self, self, no_process));  // this very process
  const RunDirOwner reused{"b00t", "pid:[4026531836]", 100, 10};  // our pid, an earlier process's
  CHECK(owner_gone(reused, self, started_at(5000)));
}

TEST_CASE("stale_run_dirs: the owner record reads back, and nothing else reads as one", "[stale_run_dirs]") {
  const RunDirOwner owner{"6a1f-b00t", "pid:[4026531836]", 4242, 987654321ULL};
  const std::string text = format_owner(owner);
  const std::optional<RunDirOwner> back = parse_owner(text);
  REQUIRE(back);
  CHECK(back->boot_id == owner.boot_id);
  CHECK(back->pid_namespace == owner.pid_namespace);
  CHECK(back->pid == owner.pid);
  CHECK(back->start_time == owner.start_time);
  CHECK_FALSE(parse_owner(""));
  CHECK_FALSE(parse_owner(text.substr(0, text.size() - 8)));               // cut short by a SIGKILL
  CHECK_FALSE(parse_owner(text.substr(0, text.find("start_time"))));       // a field missing
  CHECK_FALSE(parse_owner("cpprun run dir owner v2\n" + text.substr(text.find('\n') + 1)));
  std::string bad_pid = text;
  bad_pid.replace(bad_pid.find("pid 4242"), 8, "pid 4x42");
  CHECK_FALSE(parse_owner(bad_pid));
  CHECK_FALSE(parse_owner(text + "extra line\n"));
  const std::optional<RunDirOwner> here = this_process_owner();
  REQUIRE(here);  // Linux with /proc
  CHECK(here->pid == getpid());
  CHECK_FALSE(owner_gone(*here, *here, [](pid_t) { return std::optional<unsigned long long>(); }));
}
