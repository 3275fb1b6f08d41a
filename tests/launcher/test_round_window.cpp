// Unit tests of the rendezvous host's MIN:MAX window (rendezvous/round_window.h) on a made-up clock:
// when a round being gathered starts, times out or waits, and torchrun's last call.
#include "catch.h"

#include <chrono>

#include "rendezvous/round_window.h"

using namespace cpprun::launcher;
using namespace std::chrono_literals;

namespace {

RendezvousSettings window(int min_nodes, int max_nodes, bool fixed = false) {
  RendezvousSettings s;
  s.backend = fixed ? RendezvousBackend::kStatic : RendezvousBackend::kC10d;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.join_timeout = 600s;
  s.last_call_timeout = 30s;
  return s;
}

const RoundTime t0{};  // the clock's epoch stands for "now" at the start
const RoundTime deadline = t0 + 600s;

}  // namespace

TEST_CASE("round_window: static starts when every node is here, and never opens a last call", "[round_window]") {
  const RendezvousSettings s = window(3, 3, true);
  CHECK(last_call_after(s, 2, std::nullopt, t0) == std::nullopt);
  CHECK(last_call_after(s, 3, std::nullopt, t0) == std::nullopt);
  const GatherStep waiting = gather_step(s, 2, std::nullopt, deadline, t0 + 1s);
  CHECK(waiting.kind == GatherStep::Kind::kWait);
  CHECK(waiting.until == deadline);
  CHECK(gather_step(s, 3, std::nullopt, deadline, t0 + 1s).kind == GatherStep::Kind::kStart);
  CHECK(gather_step(s, 2, std::nullopt, deadline, deadline).kind == GatherStep::Kind::kTimedOut);
}

TEST_CASE("round_window: c10d, MAX nodes start the round at once", "[round_window]") {
  const RendezvousSettings s = window(2, 4);
  CHECK(gather_step(s, 4, std::nullopt, deadline, t0).kind == GatherStep::Kind::kStart);
  CHECK(gather_step(s, 4, t0 + 30s, deadline, t0).kind == GatherStep::Kind::kStart);  // no waiting for the call
}

TEST_CASE("round_window: c10d, the MIN-th node opens the last call; it then starts the round", "[round_window]") {
  const RendezvousSettings s = window(2, 4);
  CHECK(last_call_after(s, 1, std::nullopt, t0) == std::nullopt);  // below MIN
  const std::optional<RoundTime> call = last_call_after(s, 2, std::nullopt, t0 + 5s);
  REQUIRE(call);
  CHECK(*call == t0 + 35s);  // now + last_call_timeout
  const GatherStep before = gather_step(s, 2, call, deadline, t0 + 10s);
  CHECK(before.kind == GatherStep::Kind::kWait);
  CHECK(before.until == t0 + 35s);  // the sooner of the call and the join deadline
  CHECK(gather_step(s, 2, call, deadline, t0 + 35s).kind == GatherStep::Kind::kStart);
}

TEST_CASE("round_window: c10d, more nodes within the window keep the last call; below MIN closes it",
          "[round_window]") {
  const RendezvousSettings s = window(2, 4);
  const std::optional<RoundTime> call = t0 + 35s;
  CHECK(last_call_after(s, 3, call, t0 + 20s) == call);  // a third node does not extend it
  CHECK(last_call_after(s, 1, call, t0 + 20s) == std::nullopt);
  // Back at MIN later: a new call from then.
  CHECK(last_call_after(s, 2, std::nullopt, t0 + 50s) == t0 + 80s);
}

TEST_CASE("round_window: c10d, the join deadline starts a round at MIN, and times out below it", "[round_window]") {
  const RendezvousSettings s = window(2, 4);
  CHECK(gather_step(s, 2, std::nullopt, deadline, deadline).kind == GatherStep::Kind::kStart);
  CHECK(gather_step(s, 1, std::nullopt, deadline, deadline).kind == GatherStep::Kind::kTimedOut);
  const GatherStep late_call = gather_step(s, 2, deadline + 20s, deadline, t0 + 590s);
  CHECK(late_call.kind == GatherStep::Kind::kWait);
  CHECK(late_call.until == deadline);  // a call past the deadline is not waited for
}

TEST_CASE("round_window: c10d 1:1 starts with the host alone", "[round_window]") {
  const RendezvousSettings s = window(1, 1);
  CHECK(gather_step(s, 1, std::nullopt, deadline, t0).kind == GatherStep::Kind::kStart);
}
