// The launcher's end of its workers' flight recorders (docs/faults_and_trust.md, "Flight recorder").
// Each worker gets one end of a socket pair as fd 3 (CPPRUN_FLIGHT_RECORDER_REQUEST_FD); cpprun's
// library in the worker reads it in a thread and, at each byte, dumps the rank's last collectives to
// CPPRUN_FLIGHT_RECORDER_DIR/rank_R.json. A library that listens first creates rank_R.listening
// there, so the launcher waits only for dumps that can come: a program without cpprun's library
// (a shell script, a torch.distributed one) costs a failing job no wait at all.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "diagnosis/hang_diagnosis.h"
#include "workers/signal_relay.h"

namespace cpprun::launcher {

// The fd number a worker reads requests on.
inline constexpr int kFlightRequestFd = 3;

std::string flight_dump_file(const std::string& dir, int rank);       // DIR/rank_R.json
std::string flight_listening_file(const std::string& dir, int rank);  // DIR/rank_R.listening

// One worker's request channel. Throws std::system_error if the socket pair cannot be made.
class FlightRequestChannel {
 public:
  FlightRequestChannel();
  ~FlightRequestChannel();
  FlightRequestChannel(const FlightRequestChannel&) = delete;
  FlightRequestChannel& operator=(const FlightRequestChannel&) = delete;

  int child_fd() const { return child_fd_; }  // the worker's end, until close_child_end()
  void close_child_end();                     // once the worker holds it
  // Asks for a dump (one byte, never blocking, never SIGPIPE); false if the worker's end is gone.
  bool ask();

 private:
  int launcher_fd_ = -1;
  int child_fd_ = -1;
};

// What the launcher knows of one worker when it gathers dumps.
struct DumpSource {
  int rank = 0;
  bool running = false;
  std::string fate;                         // "still running", "exited with code 1", ...
  FlightRequestChannel* channel = nullptr;  // null: cannot be asked
};

// Asks every running worker whose library listens for a dump, then waits (through `wait_ms`, which
// must keep the workers' output flowing) until each has written one since, or `timeout` passed;
// then reads every rank's dump (one that failed may have dumped on its own). At most one wait.
std::vector<RankEvidence> gather_flight_dumps(const std::string& dir, const std::vector<DumpSource>& sources,
                                              std::chrono::milliseconds timeout,
                                              const std::function<void(int ms)>& wait_ms);

// Prints the diagnosis of `evidence` as "cpprun: diagnosis ..." lines on stderr, and writes its JSON
// to `json_file` when that is not empty. Unless `even_without_dumps`, nothing at all when no rank left
// a dump (a failing program that does not record collectives gets no noise). Returns what it printed.
// `nccl_trace_dir` (if not ""): PyTorch's NCCL flight-recorder dumps found there are named too, in the
// JSON as "nccl_trace" (diagnosis/nccl_trace.h); any there make a diagnosis even without cpprun's dumps.
std::string report_diagnosis(const std::vector<RankEvidence>& evidence, const std::string& why,
                             const std::string& json_file, bool even_without_dumps = false,
                             const std::string& nccl_trace_dir = "");

// Multi-node, where node 0 prints the diagnosis: this node's PyTorch NCCL dumps in `dir`, named on this
// console (they are on this host). Nothing when there are none.
void report_node_nccl_trace(const std::string& dir);

// `cpprun --diagnose PID`'s answer: `text` written to the requester's file (its fd `reply_fd`, opened
// through /proc), then the diagnose signal sent back to say it is there. Best effort.
void answer_diagnose_request(pid_t requester, int reply_fd, const std::string& text);

// Who asked, for an answer's first line: "cpprun --diagnose from pid 4242, 4250"; "signal 36" when
// none is known (a plain kill). Pure.
std::string diagnose_askers(const std::vector<DiagnoseRequest>& requests);

// `cpprun --diagnose` while no worker runs and cpprun stops what the workers left behind: each
// waiting request (take_diagnose_requests()) gets "cpprun: no diagnosis (asked by ...): `state`",
// shown on this console too, instead of waiting for its own timeout. Best effort.
void answer_diagnose_without_workers(const std::string& state);

}  // namespace cpprun::launcher
