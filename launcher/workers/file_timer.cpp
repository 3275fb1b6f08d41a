// The file-timer pipe: requests parsed, timers kept, expired workers signalled (torch's FileTimerServer).
#include "workers/file_timer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <system_error>

#include "workers/attempt.h"
#include "workers/job_process_tree.h"

namespace cpprun::launcher {
namespace {

// The members of a flat JSON object whose values are strings or numbers: raw text, strings unquoted
// (escapes kept). Nullopt for anything else.
std::optional<std::map<std::string, std::string>> flat_object(const std::string& text) {
  std::map<std::string, std::string> members;
  std::size_t i = 0;
  const auto space = [&] { while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i; };
  const auto string = [&](std::string& out) {
    if (i >= text.size() || text[i] != '"') return false;
    const std::size_t start = ++i;
    for (; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] == '\\') ++i;
    }
    if (i >= text.size()) return false;
    out = text.substr(start, i++ - start);
    return true;
  };
  space();
  if (i >= text.size() || text[i++] != '{') return std::nullopt;
  for (;;) {
    space();
    std::string key;
    std::string value;
    if (!string(key)) return std::nullopt;
    space();
    if (i >= text.size() || text[i++] != ':') return std::nullopt;
    space();
    if (i < text.size() && text[i] == '"') {
      if (!string(value)) return std::nullopt;
    } else {
      const std::size_t start = i;
      while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '-' ||
                                 text[i] == '+' || text[i] == '.')) {
        ++i;
      }
      if (i == start) return std::nullopt;
      value = text.substr(start, i - start);
    }
    members[key] = value;
    space();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') break;
    return std::nullopt;
  }
  return members;
}

std::optional<double> number(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::optional<std::string> file_timer_path(const std::optional<std::string>& enable,
                                           const std::optional<std::string>& timer_file, const std::string& temp_dir,
                                           const std::string& uuid) {
  if (!enable || *enable != "1") return std::nullopt;
  if (timer_file) return *timer_file;
  return temp_dir + "/watchdog_timer_" + uuid;
}

std::optional<FileTimerRequest> parse_file_timer_request(const std::string& line) {
  const auto members = flat_object(line);
  if (!members) return std::nullopt;
  const auto get = [&](const char* key) -> std::optional<std::string> {
    const auto found = members->find(key);
    if (found == members->end()) return std::nullopt;
    return found->second;
  };
  const auto pid = get("pid");
  const auto scope = get("scope_id");
  const auto expiration = get("expiration_time");
  const auto sig = get("signal");
  if (!pid || !scope || !expiration || !sig) return std::nullopt;
  const auto pid_value = number(*pid);
  const auto expiration_value = number(*expiration);
  const auto sig_value = number(*sig);
  if (!pid_value || !expiration_value || !sig_value || *pid_value < 1 || *sig_value >= NSIG) return std::nullopt;
  return FileTimerRequest{static_cast<pid_t>(*pid_value), *scope, *expiration_value, static_cast<int>(*sig_value)};
}

void FileTimerTable::apply(const FileTimerRequest& request) {
  const auto key = std::make_pair(request.pid, request.scope_id);
  if (request.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = request;
  }
}

std::vector<FileTimerTable::Expiry> FileTimerTable::take_expired(double now) {
  std::map<pid_t, std::vector<FileTimerRequest>> expired;
  for (const auto& [key, request] : timers_) {
    if (request.expiration_time <= now) expired[key.first].push_back(request);
  }
  std::vector<Expiry> result;
  for (auto& [pid, requests] : expired) {
    std::sort(requests.begin(), requests.end(),
              [](const auto& a, const auto& b) { return a.expiration_time < b.expiration_time; });
    Expiry expiry{pid, 0, {}};
    for (const FileTimerRequest& r : requests) {
      expiry.scopes.push_back(r.scope_id);
      if (expiry.signal == 0 && r.signal > 0) expiry.signal = r.signal;
    }
    result.push_back(std::move(expiry));
    for (auto it = timers_.begin(); it != timers_.end();) it = it->first.first == pid ? timers_.erase(it) : ++it;
  }
  return result;
}

FileTimerServer::FileTimerServer(std::string path, std::string job_token_entry)
    : path_(std::move(path)), job_token_entry_(std::move(job_token_entry)) {
  unlink(path_.c_str());  // torch's server replaces what is there
  if (mkfifo(path_.c_str(), 0600) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "cpprun: TORCHELASTIC_ENABLE_FILE_TIMER=1: cannot make the pipe " + path_);
  }
  // Read and write: the pipe never reports end-of-file between the workers' short-lived writers.
  fifo_ = open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fifo_ < 0 || pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    const int err = errno;
    if (fifo_ >= 0) close(fifo_);
    unlink(path_.c_str());
    throw std::system_error(err, std::generic_category(), "cpprun: cannot open the file-timer pipe " + path_);
  }
  // The thread takes no signal: they belong to the main loop's relay.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  thread_ = std::thread([this] { serve(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

FileTimerServer::~FileTimerServer() {
  const char stop = 1;
  if (write(stop_pipe_[1], &stop, 1) < 0) {
  }  // the thread's poll wakes either way once the pipe closes below
  thread_.join();
  close(stop_pipe_[0]);
  close(stop_pipe_[1]);
  close(fifo_);
  unlink(path_.c_str());
}

void FileTimerServer::serve() {
  FileTimerTable table;
  std::string buffer;
  for (;;) {
    // torch's server checks every max_interval (0.1 s under torchrun's agent).
    pollfd fds[2] = {{fifo_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, 100) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    char chunk[4096];
    for (ssize_t n; (n = read(fifo_, chunk, sizeof(chunk))) > 0;) buffer.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t end; (end = buffer.find('\n')) != std::string::npos; buffer.erase(0, end + 1)) {
      if (const auto request = parse_file_timer_request(buffer.substr(0, end))) table.apply(*request);
    }
    if (buffer.size() > (1 << 16)) buffer.clear();  // a writer that never ends its line
    for (const FileTimerTable::Expiry& expiry : table.take_expired(now_seconds())) {
      if (expiry.signal <= 0) continue;  // torch: "No signal specified ... Do not reap it."
      const std::vector<pid_t> ours =
          job_token_entry_.empty() ? std::vector<pid_t>{expiry.pid} : processes_with_env_entry(job_token_entry_);
      if (std::find(ours.begin(), ours.end(), expiry.pid) == ours.end()) continue;  // gone, or not this job's
      std::string scopes;
      for (const std::string& s : expiry.scopes) scopes += (scopes.empty() ? "" : ", ") + s;
      std::cerr << "cpprun: file timer (TORCHELASTIC_ENABLE_FILE_TIMER): " + scopes + " of pid " +
                       std::to_string(expiry.pid) + " expired; sending " + signal_name(expiry.signal) + "\n"
                << std::flush;
      kill(expiry.pid, expiry.signal);
    }
  }
}

}  // namespace cpprun::launcher
