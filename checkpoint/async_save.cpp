// See async_save.h.
#include "checkpoint/async_save.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/save_ids.h"
#include "core/failure_agreement.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/detail/group_store.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/object_collectives.h"
#include "cpprun/state_dict.h"

// Note [Asynchronous save across ranks]
// A collective save is done when every rank's file is on disk and, for a directory, rank 0 has
// written the index that names them (the index last: a reader never sees an index whose files are
// missing or from an earlier save). The synchronous save learns this with collectives
// (agree_on_failure). The background thread must not issue any: a Gloo collective from a second
// thread would interleave with the training thread's collectives on the same pairs (a
// collective's order must be the same on every rank), and its sequence numbers would differ by
// rank. So the ranks tell each other through the group's store instead, with short requests that
// never wait inside the store (cpprun/detail/group_store.h):
//   - each rank, its part written (or failed), sets async_save/<id>/written/<rank> to "ok" or
//     "failed: <why>" (when the save has a directory: a file is written by rank 0 alone);
//   - rank 0's thread polls those keys; when every part is in place it writes the index (one per
//     directory: a model's and its optimizer's), then sets async_save/<id>/result to "ok", or to
//     every rank's error;
//   - every rank's thread polls async_save/<id>/result and ends with it.
// With owners (pipeline stages, each its team saving its own tensors: checkpoint/owned_state.h)
// there is one tier more, over the owners group of the teams' roots: each team's root, its team
// heard, sets async_save/<id>/owner/<owner> there ("ok" or its team's errors; a file, which owner
// 0's root writes alone, needs none), owner 0's root collects them, writes the file or the indexes,
// and sets the result there; each team's root passes it to its team as above. The tensors moved
// between owners (a file's, to owner 0's root) and the index's names moved on the calling thread.
// So done() is true on a rank once the whole save is on disk, and wait() returns, or throws, alike
// on every rank, with no collective; a handle's destructor may wait too. <id> is a token of
// this save, broadcast with its save id when the save starts (on the calling thread, with the
// other collectives), so two saves never share keys (two saves may share a save id: a model's
// and then its optimizer's, checkpoint/save_ids.h). When the save failed, every rank removes what
// it wrote before it ends (Note [A failed save removes what it wrote],
// checkpoint/sharded_state_dict.cpp). The waits are bounded (Note [The save's deadlines]): a rank
// that died does not hold the others' threads for ever. The keys stay in the store (a few bytes per
// rank per save; the rows' records of Note [An asynchronous save in place] are removed once read).
// PyTorch's DCP async_save runs the save's collectives on its background thread, and its recipe
// (the async checkpointing tutorial) makes a second process group for them, so that they do not
// share the training group. Here that group would cost every rank more Gloo connections, and
// what it protects, the order of collectives, needs no protection when the thread issues none.
//
// Note [Async save errors are never lost]
// DCP's async_save returns a concurrent.futures.Future: an error stays in it until result() is
// called, and a Future dropped unread loses it without a word. Here the error is kept by the
// save, raised by wait() (each call) and, when no wait() has raised it, by the next save of the
// process (save_async or save_state_dict), before that one starts; a handle dropped unwaited
// first waits for the write (no torn or half-finished save when a scope ends), and when the save
// failed unseen it writes the error to stderr: the error is seen even when no save follows.

// Note [An asynchronous save in place]
// A directory of FSDP's state is written as the synchronous save writes it, each rank its own rows
// into the writers' files (Note [Each rank writes its own rows] in rows_in_place.cpp), its steps
// split between the threads. On the calling thread, collective: each rank copies its rows
// (snapshot_tensor), the root creates the directory, the root's token and metadata are broadcast,
// and ShardsInPlace's constructor creates each writer's file and sends the blocks that ranks share
// to their writers (the bytes are the copy's: training may change the rows once the call returns).
// On the background thread, no collective: each rank writes its rows (ShardsInPlace::write) and,
// for each other writer, sets async_save/<id>/rows/<part>/<writer>/<rank> to "ok" and its records
// of what it wrote in that writer's file (extents and CRC-32s), or to "failed: <why>", so that no
// writer waits for a rank that will not write; each writer then reads (and removes) the records
// of its file until the deadline (Note [The save's deadlines]) and puts its file in place
// (ShardsInPlace::finish), and the save goes on as any other: written/<rank>, the index, the
// result. A failure while the files are made on the calling thread (the directory, a file) is
// every rank's there (agreed); it is kept (PreparedPart::failed) and raised by the background
// thread through the same steps: the rank that failed reports its own error, the writers' root
// fails the save, and every rank's wait() raises it as it raises any write's error, the failed
// rank's reason in the others' when that rank is a writer (a rank of a slice that writes nothing
// reports to none: the others learn only that it failed). A copy that fails (out of memory) fails the call, as before. The
// ranks of a tensor-parallel slice that writes nothing join the collectives and then only learn
// the result.

namespace cpprun {

struct AsyncSave::State {
  explicit State(std::string where) : path(std::move(where)) {}
  ~State() { join(); }
  void join() {
    std::lock_guard<std::mutex> lock(join_mutex);
    if (thread.joinable()) thread.join();
  }

  const std::string path;
  std::thread thread;
  std::mutex join_mutex;
  std::atomic<bool> finished{false};
  std::exception_ptr error;               // set by the thread before it finishes
  std::atomic<bool> error_raised{false};  // thrown by wait() or by the next save
};

namespace detail {

struct AsyncSaveAccess {
  using State = AsyncSave::State;
  static AsyncSave make(std::shared_ptr<State> state) { return AsyncSave(std::move(state)); }
};

namespace {
namespace fs = std::filesystem;
using State = AsyncSaveAccess::State;
using Clock = std::chrono::steady_clock;

// This process's latest save: what the next one waits for.
std::mutex latest_mutex;
std::shared_ptr<State> latest;

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an error that is not a std::exception";
  }
}

// Runs `work` on a new thread of `state`, recording what it throws.
void launch(State& state, std::function<void()> work) {
  State* raw = &state;  // the state outlives the thread: its destructor joins it
  state.thread = std::thread([raw, work = std::move(work)] {
    try {
      work();
    } catch (...) {
      raw->error = std::current_exception();
    }
    raw->finished.store(true);
  });
}

// Writes PART's file, or this rank's share of its directory.
void write_part(const PreparedPart& part, const StateDictSaveOptions& options) {
  if (part.directory) {
    create_checkpoint_directory(part.path);
    write_state_dict_shard(part.shard, part.path, part.stamp);
  } else {
    write_state_dict_file(part.file_state, part.path, options, part.metadata);
  }
}

// Writes this rank's files of PARTS (its share of each directory; a file where it writes it). Each
// file it replaces is noted in this thread's ReplacedFiles, as every writer notes it.
void write_parts(const std::vector<PreparedPart>& parts, const StateDictSaveOptions& options) {
  for (const auto& part : parts) {
    if ((!part.directory && !part.writes_file) || part.in_place || part.failed) continue;  // rows: write_rows
    write_part(part, options);
  }
}

// Writes the index of each directory of PARTS whose index this rank writes, once every file is in place.
void write_indexes(const std::vector<PreparedPart>& parts) {
  for (const auto& part : parts) {
    if (!part.directory || !part.writes_index) continue;
    write_state_dict_index(part.index.weight_map, part.index.total_bytes, part.path, part.stamp, part.stem);
  }
}

// Undoes a save that failed (See Note [A failed save removes what it wrote] in
// checkpoint/sharded_state_dict.cpp): the files this rank wrote in it removed, those they replaced
// back in their place (REPLACED: Note [A failed save puts the previous files back]), and on the
// rank that drew the save id (`drew_id`) the save forgotten in its directories' memory
// (checkpoint/save_ids.h).
void undo_save(const std::vector<PreparedPart>& parts, ReplacedFiles& replaced, bool drew_id,
               const std::string& save_id) noexcept {
  replaced.put_back();
  if (!drew_id) return;
  for (const auto& part : parts) {
    if (part.directory) forget_failed_save(part.path, save_id, {std::string(part.stem)});
  }
}

std::string paths_of(const std::vector<PreparedPart>& parts) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : " and ") + part.path;
  return out;
}

// Note [The save's deadlines]
// Every rank's thread starts its clock when it starts. A root (of the writers, or of the owners)
// collects the others' reports until `deadline` (the group's timeout) and writes an index only
// before it; whoever waits for a result waits until `told_by`, two timeouts later, so that a
// result given by the deadline (or soon after: the index is small) is heard. A rank that hears
// nothing by then does not know whether the save completed: it keeps its files (the index may
// name them) and says so, rather than deleting what a completed save needs.
constexpr std::string_view kUnknown = "unknown:";

std::string verdict_of(const std::vector<std::string>& faults) {
  if (faults.empty()) return "ok";
  std::string result = "failed:";
  for (const auto& fault : faults) result += "\n  " + fault;
  return result;
}

// What one rank's background thread does in a collective save. See Note [Asynchronous save across ranks].
struct CollectiveSave {
  explicit CollectiveSave(AsyncSaveRanks r) : ranks(std::move(r)) {}

  AsyncSaveRanks ranks;
  std::string key;  // async_save/<token>
  StateDictSaveOptions options;
  std::vector<PreparedPart> parts;

  // KEY's value in GROUP's store once some rank sets it; nothing when the timeout passes first.
  std::optional<std::string> await(const ProcessGroup& group, const std::string& name,
                                   Clock::time_point deadline) const {
    for (std::chrono::milliseconds pause{1};; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      if (auto value = store_try_get(group, key + "/" + name)) return value;
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(pause);
    }
  }

  // Adds to FAULTS what each of `count` ranks (from 1) set at NAME/<r> in GROUP's store: "ok", or
  // "failed: <why>", or nothing within the timeout.
  void collect(const ProcessGroup& group, const std::string& name, int count, const std::string& who,
               Clock::time_point deadline, std::vector<std::string>& faults) const {
    for (int r = 1; r < count; ++r) {
      const auto reported = await(group, name + "/" + std::to_string(r), deadline);
      if (!reported) {
        faults.push_back(who + " " + std::to_string(r) + ": its part was not written within the group's timeout (" +
                         std::to_string(group.timeout().count()) + " ms)");
      } else if (*reported != "ok") {
        faults.push_back(reported->substr(reported->find(' ') + 1));
      }
    }
  }

  // This rank's rows of each part written in place (Note [An asynchronous save in place]), and what
  // it wrote of each other writer's file told to that writer through the store; RECORDS[part]
  // [writer]: what it wrote of each writer's file. A part this rank cannot write is told to the
  // writers too, so that none waits for it. A part that failed on the calling thread (every rank
  // has it: no writer waits for it) is this rank's error only where it failed here. LOCAL: this
  // rank's error.
  void write_rows(std::exception_ptr& local, std::vector<std::vector<std::string>>& records) const {
    records.assign(parts.size(), {});
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const PreparedPart& part = parts[i];
      if (part.failed) {
        if (part.failed_here && !local) local = part.failed;
        continue;
      }
      if (!part.in_place) continue;
      std::string failed;  // what the writers are told instead of this rank's records
      if (!local) {
        try {
          records[i] = part.in_place->write();
        } catch (...) {
          local = std::current_exception();
        }
      }
      if (local) failed = "failed: " + message_of(local);
      const ProcessGroup& writers = *ranks.team.replicas();
      const int me = ranks.team.writer_rank();
      for (int w = 0; w < writers.size(); ++w) {
        if (w == me || !part.in_place->has_file(w)) continue;  // no one to tell
        store_set(writers, key + "/" + rows_name(i, w, me),
                  failed.empty() ? "ok" + records[i][static_cast<std::size_t>(w)] : failed);
      }
    }
  }

  // Where writer FROM tells writer TO what it wrote of TO's file of part PART (under `key`).
  static std::string rows_name(std::size_t part, int to, int from) {
    return "rows/" + std::to_string(part) + "/" + std::to_string(to) + "/" + std::to_string(from);
  }

  // On a writer of a part written in place: every other writer's records of its file (MINE: this
  // rank's, write_rows's), then the file put in place. Throws when one did not come by the
  // deadline, or said that it failed (and why).
  void finish_rows(const std::vector<std::vector<std::string>>& mine, Clock::time_point deadline) const {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const PreparedPart& part = parts[i];
      if (!part.in_place || !part.in_place->writes_file()) continue;
      const ProcessGroup& writers = *ranks.team.replicas();
      const int me = ranks.team.writer_rank();
      const std::vector<int> job_ranks = get_process_group_ranks(writers);
      std::vector<std::string> records(static_cast<std::size_t>(writers.size()));
      for (int r = 0; r < writers.size(); ++r) {
        if (r == me) {
          records[static_cast<std::size_t>(r)] = mine[i][static_cast<std::size_t>(me)];
          continue;
        }
        const std::string rank = "rank " + std::to_string(job_ranks[static_cast<std::size_t>(r)]);
        const auto value = await(writers, rows_name(i, me, r), deadline);
        TORCH_CHECK(value, "cpprun: the asynchronous save to ", part.path, ": ", rank,
                    " did not write its rows within the group's timeout (", writers.timeout().count(), " ms)");
        try {
          store_delete(writers, key + "/" + rows_name(i, me, r));  // read: removed (what no one read stays)
        } catch (...) {
          // The store's own trouble: the file is fine, and the key only stays.
        }
        TORCH_CHECK(value->rfind("ok", 0) == 0, "cpprun: the asynchronous save to ", part.path, " failed on ", rank,
                    ", which could not write its rows: ", value->substr(std::string("failed: ").size()));
        records[static_cast<std::size_t>(r)] = value->substr(2);
      }
      part.in_place->finish(records);
    }
  }

  // A writer: writes its parts and learns the save's result from the writers' root, which
  // collects every writer's and writes the indexes (with owners: the owners' root collects every
  // writers' root's, and writes a file or the indexes). See Note [The save's deadlines] for
  // `deadline` and `told_by`.
  std::optional<std::string> write(std::exception_ptr& local, Clock::time_point deadline,
                                   Clock::time_point told_by) const {
    const CheckpointTeam& team = ranks.team;
    const int rank = team.writer_rank();
    const bool directory = std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.directory; });
    // A fault names the rank of the job, so that an owners' save says which stage's rank failed.
    const std::string me = "rank " + std::to_string(cpprun::rank());
    // See Note [An asynchronous save in place]: this rank's rows first, then the other files,
    // then the files of rows put in place by their writers.
    std::vector<std::vector<std::string>> records;
    try {
      write_rows(local, records);
      if (!local) write_parts(parts, options);
      if (!local) finish_rows(records, deadline);
    } catch (...) {
      if (!local) local = std::current_exception();
    }
    std::vector<std::string> faults;
    if (local) faults.push_back(me + ": " + message_of(local));
    // A part that failed on another rank during the call fails the save here too: the writers'
    // root says so, whether or not that rank can (a rank that writes nothing reports to none).
    for (const auto& part : parts) {
      if (rank == 0 && part.failed && !part.failed_here) {
        faults.push_back(me + ": " + message_of(part.failed));
        break;
      }
    }
    const ProcessGroup* writers = team.replicas();
    if (directory && writers) {
      store_set(*writers, key + "/written/" + std::to_string(rank),
                local ? "failed: " + faults.front() : std::string("ok"));
    }
    if (rank != 0) return await(*writers, "result", told_by);
    if (directory && writers) collect(*writers, "written", team.writers(), "writer", deadline, faults);
    std::string result;
    const ProcessGroup* owners = ranks.owners ? &*ranks.owners : nullptr;
    if (owners && owners->rank() != 0) {
      // This team's part is done: the owners' root hears of it, and says how the whole save ended.
      std::string report = "ok";
      for (std::size_t i = 0; i < faults.size(); ++i) report = (i ? report + "\n  " : "failed: ") + faults[i];
      if (directory) store_set(*owners, key + "/owner/" + std::to_string(owners->rank()), report);
      const auto whole = await(*owners, "result", told_by);
      result = whole.value_or(std::string(kUnknown) + "\n  " + me + " heard nothing from pipeline rank 0");
    } else {
      if (directory && owners) collect(*owners, "owner", owners->size(), "pipeline rank", deadline, faults);
      // The indexes last, once every file of every part is in place, and only before the deadline:
      // the others wait for the result until told_by, and so hear of it.
      if (faults.empty() && Clock::now() > deadline) {
        faults.push_back(me + ": every part was in place only after the group's timeout; the index was not written");
      }
      if (faults.empty()) {
        try {
          write_indexes(parts);
        } catch (...) {
          local = std::current_exception();
          faults.push_back(me + ", writing the index: " + message_of(local));
        }
      }
      result = verdict_of(faults);
      if (owners) store_set(*owners, key + "/result", result);
    }
    if (writers) store_set(*writers, key + "/result", result);
    return result;
  }

  void run() {
    const CheckpointTeam& team = ranks.team;
    const ProcessGroup& any = team.replicas()  ? *team.replicas()
                              : ranks.owners ? *ranks.owners
                                             : team.tensor_parallel().front();
    const auto deadline = Clock::now() + any.timeout();
    const auto told_by = deadline + 2 * any.timeout();
    const std::string where = paths_of(parts);
    std::exception_ptr local;
    ReplacedFiles replaced;  // what this thread's writers replace, until the result is known
    // A throw before the result is known (the store's own trouble) leaves both versions, as an
    // unknown result does: the others may have completed the save around this rank's new files.
    // After the verdict below there is nothing left to leave.
    const auto unknown_on_throw = c10::make_scope_exit([&replaced] { replaced.leave(); });
    std::optional<std::string> result;
    if (team.writes()) {
      result = write(local, deadline, told_by);
    } else {
      // Not a writer (not first in its tensor-parallel group): the result comes from the rank first
      // there, which relays it below. See Note [Teams over a {dp, tp} mesh]. Its own failure
      // during the call is its error to raise.
      for (const auto& part : parts) {
        if (part.failed && part.failed_here && !local) local = part.failed;
      }
      for (const auto& group : team.tensor_parallel()) {
        if (group.rank() != 0) {
          result = await(group, "result", told_by);
          break;
        }
      }
    }
    if (!result) result = std::string(kUnknown) + "\n  rank " + std::to_string(cpprun::rank()) + " heard nothing";
    for (const auto& group : team.tensor_parallel()) {
      if (group.rank() == 0) store_set(group, key + "/result", *result);
    }
    for (const auto& part : parts) {
      if (part.in_place) part.in_place->abandon();  // a temporary file not put in place
    }
    const bool unknown = result->rfind(kUnknown, 0) == 0;
    if (local || (!unknown && *result != "ok")) {
      undo_save(parts, replaced, ranks.drew_id, ranks.save_id);
    } else if (unknown) {
      replaced.leave();  // the new files and the previous ones (PATH.prev) both stay: see the error below
    } else {
      replaced.done();
    }
    if (local) std::rethrow_exception(local);  // this rank's own error, as it was thrown
    TORCH_CHECK(!unknown, "cpprun: rank ", cpprun::rank(), " did not learn within three times the group's timeout (",
                any.timeout().count(), " ms) whether the asynchronous save to ", where, " completed: the rank that "
                "writes its index (rank 0 of the save) did not say (is it still running?). The files this rank wrote "
                "are left in place, and those they replaced beside them as NAME.prev; load the checkpoint only if its "
                "index is there.", result->substr(kUnknown.size()));
    TORCH_CHECK(*result == "ok", "cpprun: the asynchronous save to ", where, " failed on another rank (this is rank ",
                cpprun::rank(), "):", result->substr(std::string("failed:").size()));
  }
};

}  // namespace

at::Tensor snapshot_tensor(const at::Tensor& tensor) {
  at::NoGradGuard no_grad;
  // A GPU tensor lands in pinned (page-locked) host memory: the device copies it by DMA at full
  // speed. A synchronous copy: the bytes are there when the thread starts.
  return tensor.detach().to(at::TensorOptions().dtype(tensor.scalar_type()).device(at::kCPU).pinned_memory(tensor.is_cuda()),
                            /*non_blocking=*/false, /*copy=*/true);
}

NamedTensors snapshot_state(const NamedTensors& state, bool owned) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copies;
  NamedTensors out;
  out.reserve(state.size());
  for (const auto& [name, tensor] : state) {
    at::Tensor& copy = copies[tensor.unsafeGetTensorImpl()];
    if (!copy.defined()) {
      const bool keep = tensor.is_meta() || (owned && tensor.device().is_cpu());  // nothing to copy
      copy = keep ? tensor : snapshot_tensor(tensor);
    }
    out.emplace_back(name, copy);
  }
  return out;
}

PreparedPart prepared_part(const AsyncSavePart& part, const std::string& save_id, std::optional<int64_t> step) {
  PreparedPart out;
  out.path = part.path;
  out.directory = is_sharded_state_dict_path(part.path);
  out.stem = part.stem;
  out.stamp = {save_id, step, part.metadata};
  return out;
}

std::string claim_parts_save_id(const std::vector<AsyncSavePart>& parts, const StateDictSaveOptions& options) {
  std::map<std::string, std::set<std::string>> stems_in;  // directory -> the stems written there
  for (const auto& part : parts) {
    if (is_sharded_state_dict_path(part.path)) stems_in[fs::path(part.path).lexically_normal().string()].insert(std::string(part.stem));
  }
  if (stems_in.size() == 1) return claim_save_id(stems_in.begin()->first, options, stems_in.begin()->second);
  StateDictSaveOptions drawn = options;
  if (!drawn.save_id()) drawn.save_id(new_save_id());
  for (const auto& [dir, stems] : stems_in) claim_save_id(dir, drawn, stems);
  return *drawn.save_id();
}

AsyncSave start_async_save(std::vector<AsyncSavePart> parts, const CheckpointTeam& team,
                           const StateDictSaveOptions& options) {
  TORCH_INTERNAL_ASSERT(!parts.empty(), "an asynchronous save of nothing");
  for (const auto& part : parts) check_state_dict_path(part.path);
  // Rank 0's id, in every file; and a token of this save for the store's keys (two saves may
  // share an id: a model's and then its optimizer's).
  AsyncSaveRanks ranks{team, std::nullopt, std::string(), std::string(), team.is_root()};
  if (team.is_root()) {
    ranks.save_id = claim_parts_save_id(parts, options);
    ranks.token = new_save_id();
  }
  team.broadcast_bytes(ranks.save_id);
  team.broadcast_bytes(ranks.token);
  // One save, one id: with a model and its optimizer, every file records it (load checks them).
  StateDictSaveOptions file_options = options;
  if (parts.size() > 1) file_options.save_id(ranks.save_id);
  // Each writer copies only what it writes; the other ranks nothing.
  const bool writes = team.writes();
  const int rank = team.writer_rank(), world = team.writers();
  std::vector<PreparedPart> to_write;
  std::exception_ptr failure;
  try {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      AsyncSavePart& part = parts[i];
      PreparedPart out = prepared_part(part, ranks.save_id, options.step());
      if (out.directory && part.rows.used) {
        // See Note [An asynchronous save in place]: every rank copies its own rows; what a writer
        // holds whole is the save's own already, copied here to the CPU where it is not there.
        for (RowsInPlace::Part& rows : part.rows.mine) rows.rows = snapshot_tensor(rows.rows);
        part.state = snapshot_state(part.state, /*owned=*/true);
        out.writes_index = writes && rank == 0;
        if (out.writes_index) out.index = index_plan(part.state, world, part.stem);
      } else if (out.directory && writes) {
        out.shard = state_dict_shard(part.state, rank, world, part.stem);
        out.shard.tensors = snapshot_state(out.shard.tensors, part.owned);
        out.writes_index = rank == 0;
        if (out.writes_index) out.index = index_plan(part.state, world, part.stem);
      } else if (!out.directory && writes && rank == 0) {
        out.writes_file = true;
        out.file_state = snapshot_state(part.state);
        out.metadata = std::move(part.metadata);
      }
      to_write.push_back(std::move(out));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // A copy that failed on one rank (out of memory) fails the call on every rank, before any
  // thread starts: none waits for a part that rank will never write.
  try {
    team.agree(failure, "the asynchronous save to " + parts.front().path + " (copying what each rank writes)");
  } catch (...) {
    if (ranks.drew_id) {
      for (const auto& part : parts) {
        if (is_sharded_state_dict_path(part.path)) forget_failed_save(part.path, ranks.save_id, {std::string(part.stem)});
      }
    }
    throw;
  }
  // The files of a directory written in place created, and the shared blocks sent to their
  // writers. A failure here (the directory, a file) is every rank's alike, as it would be on the
  // background thread: the save fails there, and wait() raises it.
  // The root's failures come first: its own error on the root, the others learn it (failed_here
  // says on which rank a failure is its own, to raise; the others hear of it with the result).
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!to_write[i].directory || !parts[i].rows.used) continue;
    PreparedPart& out = to_write[i];
    const std::string what = "the asynchronous save to " + parts[i].path;
    bool roots_error = false;  // the root's failure, which this rank heard of
    try {
      std::exception_ptr no_directory;
      if (team.is_root()) {
        try {
          create_checkpoint_directory(parts[i].path);
        } catch (...) {
          no_directory = std::current_exception();
        }
      }
      try {
        team.share_root_failure(no_directory);
      } catch (...) {
        roots_error = !team.is_root();
        throw;
      }
      const InPlaceStamp shared = in_place_stamp(team, out.stamp, what);
      out.in_place = std::make_shared<ShardsInPlace>(parts[i].state, std::move(parts[i].rows), team, parts[i].path,
                                                     parts[i].stem, shared.metadata, shared.token, what);
    } catch (const FailedElsewhereError&) {  // another rank's error (it reports it), agreed
      out.failed = std::current_exception();
    } catch (...) {
      out.failed = std::current_exception();
      out.failed_here = !roots_error;
    }
  }
  return launch_async_save(std::move(to_write), std::move(ranks), file_options);
}

AsyncSave launch_async_save(std::vector<PreparedPart> parts, AsyncSaveRanks ranks,
                            const StateDictSaveOptions& file_options) {
  if (ranks.owners && ranks.owners->size() == 1) ranks.owners.reset();  // one owner: a team's save
  auto state = std::make_shared<State>(paths_of(parts));
  if (ranks.team.alone() && !ranks.owners) {
    launch(*state, [parts = std::move(parts), file_options, save_id = ranks.save_id] {
      ReplacedFiles replaced;  // Note [A failed save puts the previous files back]
      try {
        write_parts(parts, file_options);
        write_indexes(parts);
      } catch (...) {
        undo_save(parts, replaced, /*drew_id=*/true, save_id);
        throw;
      }
      replaced.done();
    });
  } else {
    auto job = std::make_shared<CollectiveSave>(std::move(ranks));
    job->key = "async_save/" + job->ranks.token;
    job->options = file_options;
    job->parts = std::move(parts);
    launch(*state, [job] { job->run(); });
  }
  {
    std::lock_guard<std::mutex> lock(latest_mutex);
    latest = state;
  }
  return AsyncSaveAccess::make(std::move(state));
}

AsyncSave start_async_save(const NamedTensors& state, const CheckpointTeam& team, const std::string& path,
                           const StateDictSaveOptions& options) {
  std::vector<AsyncSavePart> parts(1);
  parts[0].state = state;
  parts[0].path = path;
  return start_async_save(std::move(parts), team, options);
}

void finish_previous_save() {
  std::shared_ptr<State> previous;
  {
    std::lock_guard<std::mutex> lock(latest_mutex);
    previous = std::move(latest);
  }
  if (!previous) return;
  previous->join();
  if (previous->error && !previous->error_raised.exchange(true)) {
    TORCH_CHECK(false, "cpprun: the previous asynchronous save, to ", previous->path,
                ", failed, and no wait() on its handle raised it: ", message_of(previous->error),
                "\nThis save did not start; call it again to save anyway. (See Note [Async save errors are never lost].)");
  }
}

}  // namespace detail

AsyncSave& AsyncSave::operator=(AsyncSave&& other) noexcept {
  if (this != &other) {
    drop();
    state_ = std::move(other.state_);
  }
  return *this;
}

AsyncSave::~AsyncSave() { drop(); }

void AsyncSave::drop() noexcept {
  if (!state_) return;
  state_->join();
  if (state_->error && !state_->error_raised.load()) {
    std::cerr << "cpprun: the asynchronous save to " << state_->path
              << " failed, and its handle was dropped before wait(): " << detail::message_of(state_->error)
              << "\ncpprun: the next save raises this error.\n";
  }
  state_.reset();
}

void AsyncSave::wait() {
  if (!state_) return;
  state_->join();
  if (state_->error) {
    state_->error_raised.store(true);
    std::rethrow_exception(state_->error);
  }
}

bool AsyncSave::done() const { return !state_ || state_->finished.load(); }

const std::string& AsyncSave::path() const {
  static const std::string none;
  return state_ ? state_->path : none;
}

}  // namespace cpprun
