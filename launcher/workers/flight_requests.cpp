#include "workers/flight_requests.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <system_error>

#include "cpprun/launcher_contract.h"
#include "diagnosis/nccl_trace.h"
#include "workers/signal_relay.h"

namespace cpprun::launcher {
namespace {

// The start of a rank's no_dump_reason when its dump file was there but could not be read.
constexpr const char* kUnreadableDump = "its dump could not be read: ";

bool file_exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string rounded_seconds(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

}  // namespace

std::string flight_dump_file(const std::string& dir, int rank) {
  return dir + "/" + contract::flight_dump_file_name(rank);
}

std::string flight_listening_file(const std::string& dir, int rank) {
  return dir + "/" + contract::flight_listening_file_name(rank);
}

FlightRequestChannel::FlightRequestChannel() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "cpprun: a flight-recorder request channel");
  }
  launcher_fd_ = fds[0];
  child_fd_ = fds[1];
  // The worker's end blocks: its reader thread sleeps in read() until asked.
  fcntl(child_fd_, F_SETFL, fcntl(child_fd_, F_GETFL) & ~O_NONBLOCK);
}

FlightRequestChannel::~FlightRequestChannel() {
  close_child_end();
  if (launcher_fd_ >= 0) close(launcher_fd_);
}

void FlightRequestChannel::close_child_end() {
  if (child_fd_ >= 0) close(child_fd_);
  child_fd_ = -1;
}

bool FlightRequestChannel::ask() {
  const char byte = 'd';
  ssize_t n = -1;
  do {
    n = send(launcher_fd_, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  // A full buffer holds unread requests already: one more dump is coming either way.
  return n == 1 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

std::vector<RankEvidence> gather_flight_dumps(const std::string& dir, const std::vector<DumpSource>& sources,
                                              std::chrono::milliseconds timeout,
                                              const std::function<void(int ms)>& wait_ms) {
  const int64_t asked_at = unix_ms_now();
  std::vector<bool> asked(sources.size(), false);
  std::vector<bool> listening(sources.size(), false);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    listening[i] = file_exists(flight_listening_file(dir, sources[i].rank));
    if (sources[i].running && listening[i] && sources[i].channel != nullptr) asked[i] = sources[i].channel->ask();
  }
  // A dump counts once it was written at or after the request. The file's time says so (the
  // library renames each dump into place whole): reading and parsing every rank's dump at each
  // 20 ms poll took seconds per poll for dumps of tens of MB (an audit, 2026-12-07: 14 s to
  // answer --diagnose). Each is parsed once, below. A file's time comes from the kernel's coarse
  // clock, up to a tick (4-10 ms) behind the one asked_at read: hence the slack.
  constexpr int64_t kCoarseClockSlackMs = 20;
  const auto fresh = [&](std::size_t i) {
    struct stat st {};
    if (::stat(flight_dump_file(dir, sources[i].rank).c_str(), &st) != 0) return false;
    const int64_t written_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
    return written_ms + kCoarseClockSlackMs >= asked_at;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (std::size_t i = 0; i < sources.size() && all; ++i) all = !asked[i] || fresh(i);
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (all || left.count() <= 0) break;
    wait_ms(static_cast<int>(std::min<long long>(left.count(), 20)));
  }
  std::vector<RankEvidence> evidence;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    RankEvidence e;
    e.rank = sources[i].rank;
    e.fate = sources[i].fate;
    std::string error;
    e.dump = read_flight_dump(flight_dump_file(dir, e.rank), error);
    if (!e.dump) {
      const bool absent = error.rfind("no dump at", 0) == 0;
      if (!absent) {
        // There, but unreadable (too large, damaged), asked for or not.
        e.no_dump_reason = kUnreadableDump + error;
      } else if (!listening[i]) {
        e.no_dump_reason = "it records no collectives (not linked with cpprun's library, or before "
                           "init_process_group)";
      } else if (asked[i]) {
        e.no_dump_reason = "asked for a dump, none came within " + rounded_seconds(timeout);
      } else {
        e.no_dump_reason = "it ended without writing one";
      }
    }
    evidence.push_back(std::move(e));
  }
  return evidence;
}

std::string report_diagnosis(const std::vector<RankEvidence>& evidence, const std::string& why,
                             const std::string& json_file, bool even_without_dumps,
                             const std::string& nccl_trace_dir) {
  // A dump that was there but could not be read (over the size limit, damaged) is reported too:
  // with none readable the diagnosis used to vanish without a word (an audit, 2026-12-07).
  bool any = false;
  for (const RankEvidence& e : evidence) {
    any = any || e.dump.has_value() || e.no_dump_reason.rfind(kUnreadableDump, 0) == 0;
  }
  const NcclTraceListing nccl = list_nccl_traces(nccl_trace_dir);
  const bool nccl_dumps = !nccl.files.empty() || nccl.unlisted != 0;
  if (!any && !even_without_dumps && !nccl_dumps) return "";
  Diagnosis diagnosis = diagnose(evidence, why);
  const std::vector<std::string> nccl_lines = nccl_trace_lines(nccl);
  diagnosis.lines.insert(diagnosis.lines.end(), nccl_lines.begin(), nccl_lines.end());
  if (nccl_dumps) {
    // One more top-level field: diagnose()'s object ends in "}\n".
    const std::size_t close = diagnosis.json.rfind('}');
    diagnosis.json = diagnosis.json.substr(0, close) + ",\"nccl_trace\":" + nccl_trace_json(nccl) + "}\n";
  }
  std::string text = "cpprun: diagnosis (" + why + "), from the ranks' flight recorders:\n";
  for (const std::string& line : diagnosis.lines) text += "cpprun:   " + line + "\n";
  std::cerr << text;
  if (!json_file.empty()) {
    // Replaced whole: a reader never sees half a file.
    const std::string partial = json_file + ".partial";
    std::ofstream out(partial, std::ios::trunc);
    out << diagnosis.json;
    out.close();
    if (!out || std::rename(partial.c_str(), json_file.c_str()) != 0) {
      std::cerr << "cpprun: warning: could not write " << json_file << "\n";
    } else {
      std::cerr << "cpprun:   (also in " << json_file << ")\n";
      text += "cpprun:   (also in " + json_file + ")\n";
    }
  }
  std::cerr << std::flush;
  return text;
}

void report_node_nccl_trace(const std::string& dir) {
  const NcclTraceListing nccl = list_nccl_traces(dir);
  if (nccl.files.empty() && nccl.unlisted == 0) return;
  for (const std::string& line : nccl_trace_lines(nccl)) std::cerr << "cpprun: (this node) " << line << "\n";
  std::cerr << std::flush;
}

void answer_diagnose_request(pid_t requester, int reply_fd, const std::string& text) {
  const std::string path = "/proc/" + std::to_string(requester) + "/fd/" + std::to_string(reply_fd);
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    std::cerr << "cpprun: warning: cannot answer the diagnosis request of pid " << requester << " (" << path
              << "): " << std::strerror(errno) << "\n";
    return;
  }
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  close(fd);
  kill(requester, diagnose_signal());
}

std::string diagnose_askers(const std::vector<DiagnoseRequest>& requests) {
  std::string pids;
  for (const DiagnoseRequest& r : requests) pids += (pids.empty() ? "" : ", ") + std::to_string(r.requester);
  return pids.empty() ? "signal " + std::to_string(diagnose_signal()) : "cpprun --diagnose from pid " + pids;
}

void answer_diagnose_without_workers(const std::string& state) {
  const std::vector<DiagnoseRequest> requests = take_diagnose_requests();
  const std::string text = "cpprun: no diagnosis (asked by " + diagnose_askers(requests) + "): " + state + "\n";
  std::cerr << text << std::flush;
  for (const DiagnoseRequest& r : requests) answer_diagnose_request(r.requester, r.reply_fd, text);
}

}  // namespace cpprun::launcher
