// torchrun's file-based watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1): workers hold timers through
// torch.distributed.elastic.timer.FileTimerClient, which writes one JSON request a line into a named
// pipe (TORCHELASTIC_TIMER_FILE): {"version": 1, "pid": P, "scope_id": S, "expiration_time": T,
// "signal": SIG}, T < 0 releasing scope S. When a timer expires, its worker gets SIG, as torch's
// FileTimerServer sends it. Unlike torchrun's agent, cpprun does not then kill itself with the same
// signal: the worker's death is an ordinary failure (summary, restart). Only processes of this job
// (CPPRUN_JOB_TOKEN in their environment) are signalled, and the pipe is the user's alone (0600).
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cpprun::launcher {

struct FileTimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // seconds since the epoch; < 0: release
  int signal = 0;              // <= 0: expire without signalling
};

// Where the pipe goes when TORCHELASTIC_ENABLE_FILE_TIMER is "1" (as torchrun, nothing otherwise):
// $TORCHELASTIC_TIMER_FILE, else TEMP_DIR/watchdog_timer_UUID. Pure.
std::optional<std::string> file_timer_path(const std::optional<std::string>& enable,
                                           const std::optional<std::string>& timer_file, const std::string& temp_dir,
                                           const std::string& uuid);

// One line of the pipe; nullopt if it is not such a request (torch's server would raise and log).
std::optional<FileTimerRequest> parse_file_timer_request(const std::string& line);

// The timers held, by (pid, scope): torch's FileTimerServer.register_timers/get_expired_timers. Pure.
class FileTimerTable {
 public:
  void apply(const FileTimerRequest& request);  // acquire (replacing the scope's timer) or release

  struct Expiry {
    pid_t pid = 0;
    int signal = 0;                   // the earliest expired timer's with a signal > 0; 0: none
    std::vector<std::string> scopes;  // every expired scope of the pid
  };
  // The pids with a timer expired at `now`; their timers are dropped (torch clears a reaped pid's).
  std::vector<Expiry> take_expired(double now);

  std::size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, FileTimerRequest> timers_;
};

// Makes the pipe at `path` (replacing a file there) and serves it on a thread until destroyed, then
// removes it. Throws std::system_error if the pipe cannot be made.
class FileTimerServer {
 public:
  FileTimerServer(std::string path, std::string job_token_entry);
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  void serve();

  std::string path_;
  std::string job_token_entry_;  // "CPPRUN_JOB_TOKEN=..."; "" signals any pid
  int fifo_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace cpprun::launcher
