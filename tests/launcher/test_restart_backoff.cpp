// Unit tests of the restart backoff: doubling delays, the cap, the reset after a healthy attempt.
#include "catch.h"

#include <chrono>
#include <vector>

#include "workers/restart_backoff.h"

using namespace cpprun::launcher;
using std::chrono::milliseconds;

namespace {

// Delays after `n` quick failures in a row (each attempt ran `ran`).
std::vector<long long> delays(RestartBackoffSettings settings, int n, milliseconds ran = milliseconds(10)) {
  RestartBackoff backoff(settings);
  std::vector<long long> out;
  for (int i = 0; i < n; ++i) out.push_back(backoff.after_failure(ran).count());
  return out;
}

}  // namespace

TEST_CASE("restart_backoff: quick failures double the delay up to the cap", "[restart_backoff]") {
  CHECK(delays({milliseconds(1000), milliseconds(30000)}, 8) ==
        std::vector<long long>{1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000});
  CHECK(delays({milliseconds(250), milliseconds(1000)}, 5) == std::vector<long long>{250, 500, 1000, 1000, 1000});
}

TEST_CASE("restart_backoff: the defaults start at 1 s and stop at 30 s", "[restart_backoff]") {
  const RestartBackoffSettings defaults;
  CHECK(defaults.initial == milliseconds(1000));
  CHECK(defaults.max == milliseconds(30000));
}

TEST_CASE("restart_backoff: a healthy attempt starts the doubling over", "[restart_backoff]") {
  RestartBackoff backoff({milliseconds(100), milliseconds(1000)});
  CHECK(backoff.after_failure(milliseconds(5)).count() == 100);
  CHECK(backoff.after_failure(milliseconds(5)).count() == 200);
  CHECK(backoff.after_failure(milliseconds(5)).count() == 400);
  // Ran as long as the cap: healthy, whatever came before.
  CHECK(backoff.after_failure(milliseconds(1000)).count() == 100);
  CHECK(backoff.after_failure(milliseconds(999)).count() == 200);
  CHECK(backoff.after_failure(milliseconds(60000)).count() == 100);
}

TEST_CASE("restart_backoff: 0 restarts at once, every time", "[restart_backoff]") {
  CHECK(delays({milliseconds(0), milliseconds(30000)}, 4) == std::vector<long long>{0, 0, 0, 0});
  CHECK(delays({milliseconds(0), milliseconds(0)}, 3) == std::vector<long long>{0, 0, 0});
}

TEST_CASE("restart_backoff: INITIAL equal to MAX is a fixed delay", "[restart_backoff]") {
  CHECK(delays({milliseconds(2000), milliseconds(2000)}, 3) == std::vector<long long>{2000, 2000, 2000});
}

TEST_CASE("restart_backoff: a cap of a day does not overflow", "[restart_backoff]") {
  const std::vector<long long> d = delays({milliseconds(1), milliseconds(86400000)}, 200);
  CHECK(d.front() == 1);
  CHECK(d.back() == 86400000);
}

TEST_CASE("restart_backoff: the line before a wait names the restart, the flag and the rule", "[restart_backoff]") {
  CHECK(restart_wait_line({milliseconds(500), milliseconds(20000)}, milliseconds(1000), 2, 3) ==
        "cpprun: restarting in 1 s (restart 2 of --max_restarts=3; --restart_backoff=0.5:20 doubles the wait after "
        "each attempt that fails within 20 s, up to 20 s)");
}
