// join_ranks(): the join check and the job-wide GPU vote of init_process_group.
#include "comm/rank_join.h"

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace cpprun::detail {

// Note [One device choice per job]
// Whether to use the GPUs (NCCL) or the CPU (Gloo) must be one choice for the whole job: ranks
// that chose differently would wait for each other in different backends until the timeout. A
// rank can see only its own node, and nodes may differ (one has no GPU, or fewer than its ranks),
// so every rank votes: it adds 1 to a counter when it lacks a GPU, *before* it announces that it
// joined. Once every rank has joined, the counter is final and every rank reads the same value.
JoinResult join_ranks(c10d::Store& store, const DistEnv& env, std::chrono::milliseconds timeout, bool has_gpu) {
  const std::string without_gpu = "ranks_without_gpu";
  store.add(without_gpu, has_gpu ? 0 : 1);
  auto key = [](int rank) { return "joined/" + std::to_string(rank); };
  store.set(key(env.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(key(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < env.world_size; ++r) {
      bool joined = false;
      try {
        joined = store.check({key(r)});
      } catch (const std::exception&) {
      }
      if (!joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    TORCH_CHECK(false, "cpprun: rank ", env.rank, " timed out after ", timeout.count() / 1000.0,
                " s waiting for the job's ", env.world_size, " ranks to join at MASTER_ADDR=", env.master_addr,
                " MASTER_PORT=", env.master_port, ". Ranks not joined: ", missing.empty() ? "(unknown)" : missing,
                ". Did every worker start, with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT?\nc10d said: ",
                e.what());
  }
  return {store.add(without_gpu, 0) == 0};
}

}  // namespace cpprun::detail
