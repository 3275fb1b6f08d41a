// join_ranks(): the join check and the job-wide GPU vote of init_process_group.
#include "comm/rank_join.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace cpprun::detail {

// Note [One device choice per job]
// Whether to use the GPUs (NCCL) or the CPU (Gloo) must be one choice for the whole job: ranks
// that chose differently would wait for each other in different backends until the timeout. A
// rank can see only its own node, and nodes may differ (one has no GPU, or fewer than its ranks),
// so every rank votes: it adds 1 to a counter when it lacks a GPU, *before* it announces that it
// joined. Once every rank has joined, the counter is final and every rank reads the same value.
// Note [Ranks that disagree at join]
// Every rank must come with the same WORLD_SIZE and a RANK of its own. A rank whose WORLD_SIZE
// differs would wait for ranks that never come (or the others would go on without it and hang in
// their first collective), and two ranks with one RANK leave another missing: all of it used to end
// in a raw time-out. So each rank publishes its WORLD_SIZE under its joined key, the first to arrive
// fixes the job's ("world_size"), and a rank that finds another value, or finds its RANK taken,
// says so to every rank through "join_error", which the others look at while they wait.
JoinResult join_ranks(c10d::Store& store, const DistEnv& env, std::chrono::milliseconds timeout, bool has_gpu) {
  const std::string without_gpu = "ranks_without_gpu";
  const std::string join_error = "join_error";
  const auto as_bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  const auto as_text = [](const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); };
  const auto fail_everywhere = [&](const std::string& message) {
    store.compareSet(join_error, {}, as_bytes(message));
    if (env.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1));  // see below: the store's host
    TORCH_CHECK(false, message);
  };
  const std::string mine = std::to_string(env.world_size);
  const std::string first = as_text(store.compareSet("world_size", {}, as_bytes(mine)));
  if (first != mine) {
    fail_everywhere("cpprun: the ranks disagree on WORLD_SIZE: rank " + std::to_string(env.rank) + " has WORLD_SIZE=" +
                    mine + ", but a rank that joined before it has WORLD_SIZE=" + first +
                    ". Start every worker with the same WORLD_SIZE (a launcher sets it for all).");
  }
  if (store.add("rank_claims/" + std::to_string(env.rank), 1) > 1) {
    fail_everywhere("cpprun: two processes have RANK=" + std::to_string(env.rank) + " (of WORLD_SIZE=" + mine +
                    "): every worker needs a RANK of its own, 0 to " + std::to_string(env.world_size - 1) + ".");
  }
  store.add(without_gpu, has_gpu ? 0 : 1);
  auto key = [](int rank) { return "joined/" + std::to_string(rank); };
  store.set(key(env.rank), as_bytes(mine));
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(key(r));
  // Polled rather than waited with store.wait(), so that another rank's join error ends this wait
  // too (c10d can wait only for all of several keys, and logs every timed-out wait): 2 ms after
  // the first look, doubling to 100 ms, a few store round trips a second.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::chrono::milliseconds pause{2}; !store.check(keys); pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
    if (store.check({join_error})) {
      // The store's host (rank 0) stays a moment, so that every waiting rank reads the reason
      // before the store goes away with it.
      if (env.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
      TORCH_CHECK(false, as_text(store.get(join_error)));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (int r = 0; r < env.world_size; ++r) {
        if (!store.check({key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      TORCH_CHECK(false, "cpprun: rank ", env.rank, " timed out after ", timeout.count() / 1000.0,
                  " s waiting for the job's ", env.world_size, " ranks to join at MASTER_ADDR=", env.master_addr,
                  " MASTER_PORT=", env.master_port, ". Ranks not joined: ", missing.empty() ? "(unknown)" : missing,
                  ". Did every worker start, with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT?");
    }
    std::this_thread::sleep_for(pause);
  }
  return {store.add(without_gpu, 0) == 0};
}

}  // namespace cpprun::detail
