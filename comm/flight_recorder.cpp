// This process's flight recorder: settings, recording, and the three things that dump it.
#include "comm/flight_recorder.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include "comm/public_call.h"
#include "cpprun/atomic_file.h"
#include "cpprun/launcher_contract.h"
#include "support/error_report_hook.h"

namespace cpprun {
namespace detail {

// Note [Flight recorder]
// Every collective is recorded where it is issued (issue_collective, and isend/irecv) and
// finished where it is waited (Work::wait, Work::is_completed): a few hundred nanoseconds under
// one process-wide mutex, so it is always on. A collective therefore shows "started" until its
// Work is waited: what a hung rank shows is the collective it waits in. Dumps snapshot the ring
// under its mutex and write the file outside it, one dump at a time (dump_mutex). Three things
// dump: a failed wait (before its error reaches the caller), a byte on the request fd (a thread
// of its own, blocked in read()), and std::terminate. The ring, the settings and the mutexes are
// never destroyed, so that the listener thread or a terminate handler running during exit never
// touches a destroyed object.

namespace {

constexpr const char* kEntriesVar = "CPPRUN_FLIGHT_RECORDER_ENTRIES";
// The launcher sets these: cpprun/launcher_contract.h.
constexpr const char* kDirVar = contract::kFlightRecorderDirVariable;
constexpr const char* kRequestFdVar = contract::kFlightRecorderRequestFdVariable;
constexpr std::size_t kDefaultEntries = 2000;
constexpr std::size_t kMaxEntries = 1'000'000;

int64_t now_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<std::string> getenv_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// What dumps need to know, fixed by start_flight_recorder() before any thread reads it.
struct Settings {
  std::atomic<int> rank{-1};  // -1 until init_process_group: RANK from the environment, or 0
  std::atomic<int> world_size{1};
  std::mutex dir_mutex;
  std::optional<std::string> dir;  // CPPRUN_FLIGHT_RECORDER_DIR, read at start
  bool dir_read = false;
  std::timed_mutex dump_mutex;     // one writer of rank_R.json.tmp at a time
  std::atomic<bool> failure_dumped{false};  // see dump_after_failure()
  // The worker's own pid: a child it forked (a data loader's helper) that exits through exit() or
  // terminates runs the same handlers, and must not replace the worker's file with its copy.
  std::atomic<pid_t> recording_pid{0};
};
Settings& settings() {
  static Settings* s = new Settings();  // never destroyed: see Note [Flight recorder]
  return *s;
}

std::optional<std::string> dump_dir() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.dir_mutex);
  if (!s.dir_read) {
    s.dir = getenv_string(kDirVar);
    if (s.dir && s.dir->empty()) s.dir.reset();
    s.dir_read = true;
  }
  return s.dir;
}

int dump_rank() {
  const int rank = settings().rank.load();
  if (rank >= 0) return rank;
  const char* env = std::getenv("RANK");
  int parsed = 0;
  if (env != nullptr) std::from_chars(env, env + std::strlen(env), parsed);
  return parsed;
}

// Writes the dump to `path`; waits at most `patience` for another thread's dump to finish
// (a terminate handler must not wait for ever).
void write_dump(const std::string& path, DumpReason reason, std::chrono::milliseconds patience) {
  std::vector<FlightRecorderEntry> entries = flight_recorder().entries();
  DumpHeader header;
  header.rank = dump_rank();
  header.world_size = settings().world_size.load();
  header.pid = static_cast<int64_t>(getpid());
  header.dumped_unix_ms = now_unix_ms();
  header.reason = reason;
  const std::string json = flight_recorder_json(header, entries);
  std::unique_lock<std::timed_mutex> lock(settings().dump_mutex, std::defer_lock);
  if (!lock.try_lock_for(patience)) {
    throw std::runtime_error("another thread's dump did not finish within " + std::to_string(patience.count()) + " ms");
  }
  write_file_atomically(path, json);
}

bool dump_to_dir(DumpReason reason, std::chrono::milliseconds patience) {
  const std::optional<std::string> dir = dump_dir();
  if (!dir) return false;
  if (const pid_t owner = settings().recording_pid.load(); owner != 0 && owner != getpid()) return false;
  const std::string path = *dir + "/" + contract::flight_dump_file_name(dump_rank());
  try {
    std::filesystem::create_directories(*dir);  // the first dump makes it: see announce_listening()
    write_dump(path, reason, patience);
    return true;
  } catch (const std::exception& e) {
    std::cerr << "cpprun: rank " << dump_rank() << ": could not write the flight recorder (reason "
              << to_string(reason) << ") to " << path << ": " << e.what() << "\n";
    return false;
  }
}

// The request listener: each read that returns bytes asks for one dump (bytes that arrive
// together are answered by one); EOF or an error ends it quietly.
void listen_for_requests(int fd) {
  char bytes[64];
  for (;;) {
    const ssize_t n = read(fd, bytes, sizeof(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    dump_to_dir(DumpReason::kRequest, std::chrono::seconds(60));
  }
}

// Tells the launcher that this rank answers requests (rank_R.listening beside its dumps), so that
// it waits for dumps only from ranks that can write one (launcher/workers/flight_requests.h). The
// directory is made here, not by the launcher: a job of programs without cpprun's library leaves
// exactly torchrun's --log_dir tree.
void announce_listening(int rank) {
  const std::optional<std::string> dir = dump_dir();
  if (!dir) return;
  std::error_code error;
  std::filesystem::create_directories(*dir, error);
  const std::string path = *dir + "/" + contract::flight_listening_file_name(rank);
  const int fd = error ? -1 : open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::cerr << "cpprun: rank " << rank << ": cannot announce the flight recorder at " << path << ": "
              << (error ? error.message() : std::strerror(errno)) << " (the launcher will not ask for dumps)\n";
    return;
  }
  close(fd);
}

int parse_request_fd(const std::string& text) {
  int fd = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, fd);
  TORCH_CHECK(ec == std::errc() && ptr == end && fd >= 0, "cpprun: ", kRequestFdVar, "=\"", text,
              "\" is not a file descriptor number; the launcher sets it to the read end of a pipe it "
              "passes to the worker. Unset it to start without flight-recorder requests.");
  TORCH_CHECK(fcntl(fd, F_GETFD) != -1, "cpprun: ", kRequestFdVar, "=", fd, " names no open file "
              "descriptor in this process: the launcher must pass the pipe's read end to the worker "
              "(not close-on-exec). Unset it to start without flight-recorder requests.");
  return fd;
}

// Note [First failure dump]
// A failure's dump describes the moment things went wrong; what follows (the error unwinding to
// main, std::terminate, the other collectives in flight failing in turn) would only overwrite it.
// So the first failure, timeout, terminate or cpprun::record dump is kept; requests still dump.
bool dump_after_failure(DumpReason reason, std::chrono::milliseconds patience) {
  if (settings().failure_dumped.exchange(true)) return false;
  return dump_to_dir(reason, patience);
}

// Note [Exit dump]
// Under a launcher (CPPRUN_FLIGHT_RECORDER_DIR set), a rank that ends normally leaves its last
// collectives too: when another rank then fails or hangs, the diagnosis can say where this one was
// when it left ("finished all_reduce #41 ... (then exited with code 0)"), the commonest cause of a
// hang being a rank that stopped calling collectives. A failure's dump is kept instead
// (Note [First failure dump]). A few milliseconds at exit.
// Once it is written (or a failure's is kept), the dump mutex stays held until the process ends:
// a request that arrives during exit (the launcher asks every live rank once another has failed)
// would otherwise start writing rank_R.json.tmp on the listener thread just as exit ends every
// thread, and leave the .tmp behind; it waits instead, and the file on disk is this dump.
void dump_at_exit() {
  if (!settings().failure_dumped.exchange(true)) dump_to_dir(DumpReason::kExit, std::chrono::seconds(2));
  // Never unlocked (the mutex is never destroyed: Note [Flight recorder]).
  (void)settings().dump_mutex.try_lock_for(std::chrono::seconds(2));
}

std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void dump_on_terminate() {
  dump_after_failure(DumpReason::kTerminate, std::chrono::seconds(2));
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

bool timed_out(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("timeout") != std::string::npos ||
         what.find("Timeout") != std::string::npos;
}

}  // namespace

std::size_t parse_flight_recorder_entries(const std::optional<std::string>& value) {
  if (!value) return kDefaultEntries;
  std::size_t entries = 0;
  const char* end = value->data() + value->size();
  const auto [ptr, ec] = std::from_chars(value->data(), end, entries);
  TORCH_CHECK(!value->empty() && ec == std::errc() && ptr == end && entries <= kMaxEntries, "cpprun: ",
              kEntriesVar, "=\"", *value, "\" is not a number of entries: give a whole number from 0 to ",
              kMaxEntries, " (the flight recorder keeps that many of the last collectives; 0 turns it off; "
              "unset means ", kDefaultEntries, ").");
  return entries;
}

FlightRecorderRing& flight_recorder() {
  static FlightRecorderRing* ring = new FlightRecorderRing(parse_flight_recorder_entries(getenv_string(kEntriesVar)));
  return *ring;
}

void start_flight_recorder(const DistEnv& env) {
  (void)flight_recorder();  // a bad CPPRUN_FLIGHT_RECORDER_ENTRIES fails here, at init
  std::optional<int> request_fd;
  if (auto text = getenv_string(kRequestFdVar); text && !text->empty()) request_fd = parse_request_fd(*text);
  Settings& s = settings();
  int unset = -1;
  if (s.rank.compare_exchange_strong(unset, env.rank)) s.world_size = env.world_size;  // the first group: the job's
  (void)dump_dir();

  static std::once_flag started;
  std::call_once(started, [&] {
    previous_terminate = std::set_terminate(dump_on_terminate);
    s.recording_pid = getpid();
    if (dump_dir()) std::atexit(dump_at_exit);
    if (request_fd) {
      // The worker's own children (a data loader's helpers, a shell) must not hold the pipe.
      fcntl(*request_fd, F_SETFD, fcntl(*request_fd, F_GETFD) | FD_CLOEXEC);
      std::thread(listen_for_requests, *request_fd).detach();
      announce_listening(env.rank);
    }
  });
}

std::shared_ptr<const RecordedGroup> recorded_world_group(int index, int world_size) {
  auto group = std::make_shared<RecordedGroup>();
  group->name = std::to_string(index);
  for (int r = 0; r < world_size; ++r) group->ranks.push_back(r);
  return group;
}

std::shared_ptr<const RecordedGroup> recorded_subgroup(const RecordedGroup& parent, const std::string& name,
                                                       const std::vector<int>& members_in_parent) {
  auto group = std::make_shared<RecordedGroup>();
  group->name = parent.name + "/" + name;
  for (int r : members_in_parent) {
    group->ranks.push_back(r >= 0 && r < static_cast<int>(parent.ranks.size()) ? parent.ranks[r] : r);
  }
  return group;
}

namespace {
// A call as issued now, with its group, number, op and tensors (at most two, the output first).
RecordedCall call_of(const std::shared_ptr<const RecordedGroup>& group, uint64_t seq, const char* op,
                     c10::ArrayRef<at::Tensor> tensors) {
  RecordedCall call;
  call.group = group;
  call.seq = seq;
  call.op = op;
  call.public_call = PublicCallScope::current();
  for (const at::Tensor& t : tensors) {
    if (call.tensor_count == RecordedCall::kMaxTensors || !t.defined()) break;
    call.dtype = t.scalar_type();
    const auto sizes = t.sizes();
    call.shapes[call.tensor_count++].assign(sizes.begin(), sizes.end());
  }
  call.start_unix_ms = now_unix_ms();
  return call;
}
}  // namespace

uint64_t record_issued(const std::shared_ptr<const RecordedGroup>& group, uint64_t seq, const char* op,
                       c10::ArrayRef<at::Tensor> tensors, std::optional<ReduceOp> reduce,
                       std::optional<int> root) {
  FlightRecorderRing& ring = flight_recorder();
  if (!ring.enabled()) return 0;
  RecordedCall call = call_of(group, seq, op, tensors);
  call.reduce = reduce;
  call.root = root;
  return ring.start(std::move(call));
}

uint64_t record_message(const std::shared_ptr<const RecordedGroup>& group, uint64_t seq, const char* op,
                        const at::Tensor& tensor, std::optional<int> peer, int tag, std::string label) {
  FlightRecorderRing& ring = flight_recorder();
  if (!ring.enabled()) return 0;
  RecordedCall call = call_of(group, seq, op, {tensor});
  call.root = peer;
  call.tag = tag;
  if (!label.empty()) call.label = std::move(label);
  return ring.start(std::move(call));
}

void record_completed(uint64_t id) {
  if (id != 0) flight_recorder().finish(id, CollectiveState::kCompleted, now_unix_ms());
}

void record_failed(uint64_t id, std::chrono::milliseconds timeout, std::exception_ptr error) {
  if (id == 0) return;
  const int64_t end = now_unix_ms();
  int64_t start = end;
  if (!flight_recorder().finish(id, CollectiveState::kFailed, end, &start)) return;  // dumped already
  std::string what;
  try {
    if (error) std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  const bool timeout_passed = timeout.count() > 0 && end - start >= timeout.count();
  dump_after_failure(timeout_passed || timed_out(what) ? DumpReason::kTimeout : DumpReason::kFailure,
                     std::chrono::seconds(60));
}

bool dump_after_failure(DumpReason reason) { return dump_after_failure(reason, std::chrono::seconds(60)); }

namespace {
// cpprun::record reports an error (support/, the bottom layer) through its hook: the dump first, unless a
// failed collective dumped already. Installed when this file is linked, as any process group links it.
// Never throws: an error reporting the error (out of memory) must not turn the worker's exit into an abort.
void dump_on_error_report() noexcept {
  try {
    dump_after_failure(DumpReason::kFailure);
  } catch (...) {
  }
}
const bool error_report_hook_installed = (set_error_report_hook(&dump_on_error_report), true);
}  // namespace

}  // namespace detail

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kStarted: return "started";
    case CollectiveState::kCompleted: return "completed";
    case CollectiveState::kFailed: return "failed";
  }
  return "?";
}

std::vector<FlightRecorderEntry> flight_recorder_entries() { return detail::flight_recorder().entries(); }

void dump_flight_recorder(const std::string& path) {
  detail::write_dump(path, detail::DumpReason::kRequest, std::chrono::seconds(60));
}

}  // namespace cpprun
