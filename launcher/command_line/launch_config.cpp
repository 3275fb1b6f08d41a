// CLI11 definition of cpprun's options (torchrun's names, both spellings) and their validation.
#include "command_line/launch_config.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>

#include "command_line/option_spelling.h"
#include "command_line/scheduler_env.h"
#include "common/host_secret.h"
#include "common/job_secret.h"

namespace cpprun::launcher {
namespace {

// CLI11 only knows the options; the usage line should also show what follows them. It also shows
// the variable of each flag that cpprun reads itself (Note [A flag from PET_<NAME>]).
struct CpprunFormatter : CLI::Formatter {
  struct EnvFlag {
    const CLI::Option* option;
    std::string variable;  // PET_<NAME>
    bool* value;           // set from the variable when the flag is not given
  };
  std::vector<EnvFlag> env_flags;

  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, std::move(name));
    const auto end = usage.find_last_not_of('\n') + 1;
    return usage.substr(0, end) + " PROGRAM [ARGS...]" + usage.substr(end);
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string opts = CLI::Formatter::make_option_opts(opt);
    for (const EnvFlag& flag : env_flags) {
      if (flag.option == opt) opts += " (Env:" + flag.variable + ")";
    }
    return opts;
  }
};

// Note [A flag from PET_<NAME>]
// torchrun reads a flag's PET_<NAME> as bool(int(value)) (argparse_util.py, check_env): whatever
// Python's int() takes, 0 is off and any other integer on, -1 included. CLI11 would read -1 as off
// and name no variable when it refuses a value, so cpprun reads these variables itself: the integers
// as Python has them (surrounding whitespace, a sign, underscores between digits), and also the
// words CLI11 read (true/false, yes/no, on/off, t/f, y/n, enable/disable), where torchrun stops
// with a ValueError. Empty is unset.
std::optional<bool> python_int_is_nonzero(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) text.remove_prefix(1);
  bool nonzero = false;
  bool after_digit = false;
  for (const char c : text) {
    if (c == '_' && after_digit) {
      after_digit = false;  // one underscore, and only between digits
    } else if (c >= '0' && c <= '9') {
      nonzero = nonzero || c != '0';
      after_digit = true;
    } else {
      return std::nullopt;
    }
  }
  if (!after_digit) return std::nullopt;  // empty, a lone sign, or a trailing underscore
  return nonzero;
}

bool flag_from_env(const std::string& name, const std::string& value) {
  if (const std::optional<bool> on = python_int_is_nonzero(value)) return *on;
  std::string word = value;
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* on : {"true", "yes", "on", "t", "y", "enable"}) {
    if (word == on) return true;
  }
  for (const char* off : {"false", "no", "off", "f", "n", "disable"}) {
    if (word == off) return false;
  }
  throw UsageError(name + "=" + value + ": expected an integer, as torchrun reads it (0: off; any other, -1 "
                   "included: on), or true/false; unset it or pass the flag instead");
}

// The options that need checking, as typed; validate() turns them into a LaunchConfig, to which the
// others bind directly. Numbers are read as text so that errors can name the flag, the value and the fix.
struct RawOptions {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  std::string node_rank = "0";
  std::string master_addr = "127.0.0.1";
  std::string master_port = "29500";
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  std::string max_restarts = "0";
  std::string restart_backoff = "1:30";
  std::string shutdown_timeout;  // unset: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5
  std::string monitor_interval = "0.1";
  bool no_python = false;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string log_dir;
  bool module = false;    // torchrun's -m
  bool run_path = false;  // torchrun's --run_path
  std::string job_secret_file;
  // torchrun 2.x's newer options (docs/torchrun_options.md: what cpprun does with each).
  std::string start_method = "spawn";
  std::string event_log_handler = "null";
  std::string log_line_prefix_template;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  std::string local_addr;
  std::string logs_specs;
  std::string numa_binding;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string print_completion;
  bool master_port_given = false;  // on the command line, as PET_MASTER_PORT or from the scheduler
};

int parse_int_in_range(const std::string& flag, const std::string& text, int min, int max,
                       const std::string& meaning, int example) {
  if (const std::optional<int> value = int_in_range(text, min, max)) return *value;
  throw UsageError(with_value(flag, text) + ": expected " + meaning + ", a whole number from " + std::to_string(min) +
                   " to " + std::to_string(max) + " (e.g. " + flag + "=" + std::to_string(example) + ")");
}

int parse_nproc_per_node(const std::string& text, const HostFacts& host) {
  const std::string flag = "--nproc_per_node";
  // torchrun's meanings: auto = one per GPU if there are GPUs, else one per CPU this process may run on
  // (its affinity mask: taskset, a cgroup cpuset), as torch._utils.cpu_count().
  if (text == "cpu") return host.cpu_count;
  if (text == "auto") return host.gpu_count > 0 ? host.gpu_count : host.cpu_count;
  if (text == "gpu") {
    if (host.gpu_count > 0) return host.gpu_count;
    throw UsageError(with_value(flag, text) +
                     ": no NVIDIA GPU is visible (no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES hides them "
                     "all); pass a number of workers, or 'cpu' for one per CPU core");
  }
  if (text == "xpu") {
    throw UsageError(with_value(flag, text) +
                     ": cpprun counts NVIDIA GPUs only (its LibTorch is a CUDA or CPU build), not Intel XPUs; "
                     "pass the number of workers (e.g. --nproc_per_node=4), or 'gpu' or 'cpu'");
  }
  if (const std::optional<int> value = int_in_range(text, 1, kMaxNprocPerNode)) return *value;
  throw UsageError(with_value(flag, text) + ": expected the number of workers on this node, a whole number from 1 to " +
                   std::to_string(kMaxNprocPerNode) + ", or one of auto, cpu, gpu (e.g. --nproc_per_node=4)");
}

struct NodeRange {
  int min = 1;
  int max = 1;
};

// "2" (= 2:2) or torchrun's MIN:MAX.
NodeRange parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  const std::string min_text = text.substr(0, colon);
  const std::string max_text = colon == std::string::npos ? min_text : text.substr(colon + 1);
  const std::optional<int> min = int_in_range(min_text, 1, kMaxNodes);
  const std::optional<int> max = int_in_range(max_text, 1, kMaxNodes);
  if (!min || !max) {
    throw UsageError(with_value("--nnodes", text) +
                     ": expected the number of nodes, a whole number >= 1 (e.g. --nnodes=2), or torchrun's "
                     "MIN:MAX (e.g. --nnodes=2:4, with --rdzv_backend=c10d)");
  }
  if (*min > *max) {
    throw UsageError(with_value("--nnodes", text) + ": MIN is above MAX; write --nnodes=" + max_text + ":" +
                     min_text + " (at least " + max_text + " nodes, at most " + min_text + ")");
  }
  return {*min, *max};
}

// torchrun's backends but etcd, which needs an etcd server.
RendezvousBackend parse_rdzv_backend(const std::string& backend) {
  if (backend == "static") return RendezvousBackend::kStatic;
  if (backend == "c10d") return RendezvousBackend::kC10d;
  if (backend == "etcd" || backend == "etcd-v2") {
    throw UsageError(with_value("--rdzv_backend", backend) +
                     ": the etcd rendezvous is not implemented; cpprun's dynamic rendezvous needs no server: "
                     "use --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT --rdzv_id=ID --nnodes=MIN:MAX");
  }
  throw UsageError(with_value("--rdzv_backend", backend) +
                   ": unknown rendezvous backend; cpprun has static (the default) and c10d");
}

// HOST, HOST:PORT or [IPv6]:PORT: sets master_addr, and master_port when PORT is given. `example`: a
// port for the error to suggest; `lowest_port` 0 where port 0 means "pick one" (c10d, one node).
void read_rdzv_endpoint(const std::string& text, int example, LaunchConfig& config, int lowest_port = 1) {
  const std::string flag = "--rdzv_endpoint";
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':')) {
      throw UsageError(with_value(flag, text) + ": expected HOST:PORT, e.g. --rdzv_endpoint=[::1]:29500");
    }
    config.master_addr = text.substr(1, close - 1);
    if (close + 1 < text.size()) port = text.substr(close + 2);
  } else {
    const auto colon = text.find(':');
    if (colon != std::string::npos && text.find(':', colon + 1) != std::string::npos) {
      throw UsageError(with_value(flag, text) + ": an IPv6 address needs brackets, e.g. --rdzv_endpoint=[::1]:29500");
    }
    config.master_addr = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  if (config.master_addr.empty()) {
    throw UsageError(with_value(flag, text) + ": expected HOST:PORT of node 0, e.g. --rdzv_endpoint=10.0.0.1:29500");
  }
  config.master_addr_flag = "the host of " + with_value(flag, text);
  if (!port.empty()) {
    // torchrun's _try_parse_port takes ^[0-9]{1,5}$ alone: no sign, space or underscore here.
    const bool digits = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) {
      throw UsageError(with_value(flag, text) + ": the port must be 1 to 5 digits, as torchrun's, e.g. " +
                       std::to_string(example));
    }
    config.master_port = parse_int_in_range(flag + " port", port, lowest_port, 65535, "a TCP port", example);
  }
}

// Decimal numbers ("5", "0.5"); "5s", "nan" and "" are not.
bool read_double(const std::string& text, double& out) {
  errno = 0;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return !text.empty() && errno == 0 && end == text.c_str() + text.size() && std::isfinite(out);
}

// 0 to 86400 seconds.
std::optional<std::chrono::milliseconds> read_seconds(const std::string& text) {
  double seconds = 0;
  if (!read_double(text, seconds) || seconds < 0 || seconds > 86400) return std::nullopt;
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text) {
  if (const auto ms = read_seconds(text)) return *ms;
  throw UsageError(with_value(flag, text) + ": expected a number of seconds from 0 to 86400 (e.g. " + flag + "=5)");
}

// INITIAL[:MAX] seconds. MAX defaults to 30 s, or INITIAL if that is longer (a fixed delay).
RestartBackoffSettings parse_restart_backoff(const std::string& text) {
  const std::string flag = "--restart_backoff";
  const auto colon = text.find(':');
  const auto seconds = [&](const std::string& part) {
    if (const auto ms = read_seconds(part)) return *ms;
    throw UsageError(with_value(flag, text) + ": expected INITIAL[:MAX], seconds from 0 to 86400: the wait "
                     "before the first restart after a failure, doubling with each failure in a row up to MAX "
                     "(e.g. " + flag + "=1:30; 0 restarts at once)");
  };
  RestartBackoffSettings settings;
  settings.initial = seconds(text.substr(0, colon));
  settings.max =
      colon == std::string::npos ? std::max(settings.max, settings.initial) : seconds(text.substr(colon + 1));
  if (settings.max < settings.initial) {
    throw UsageError(with_value(flag, text) + ": MAX is below INITIAL; write " + flag + "=" + text.substr(colon + 1) +
                     ":" + text.substr(0, colon) + " (or INITIAL alone for a fixed wait)");
  }
  return settings;
}

// torchrun's spellings of a boolean (RendezvousParameters.get_as_bool).
std::optional<bool> read_bool(const std::string& text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "1" || lower == "true" || lower == "t" || lower == "yes" || lower == "y") return true;
  if (lower == "0" || lower == "false" || lower == "f" || lower == "no" || lower == "n") return false;
  return std::nullopt;
}

// Surrounding whitespace and one pair of matching quotes: PyTorch's own launcher tests pass
// "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'" in one argv word, quotes included.
std::string unquoted(std::string text) {
  const auto trim = [](std::string& t) {
    const auto first = t.find_first_not_of(" \t");
    t = first == std::string::npos ? std::string() : t.substr(first, t.find_last_not_of(" \t") - first + 1);
  };
  trim(text);
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') && text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
    trim(text);
  }
  return text;
}

// Note [--rdzv_conf as torchrun's backends read it]
// --rdzv_conf KEY=VALUE,...: every key torchrun 2.15's backends read, with their meanings and defaults.
// static (static_tcp_rendezvous.py): `timeout`, the join wait, 900 s by default (launcher/api.py's
// LaunchConfig sets it when not given); `rank` is the launcher's own (--node_rank), accepted unused.
// c10d (dynamic_rendezvous.py, c10d_rendezvous_backend.py): join_timeout (600), last_call_timeout
// (30), is_host, and close_timeout, heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt,
// cas_backoff_max_seconds, read_timeout and store_type, checked as torchrun checks them and unused (no
// agent here waits on a store; a node is lost when its link closes). c10d ignores `timeout`, and the
// static backend c10d's keys (torchrun runs a one-node job with c10d): accepted, and a key the user
// may have meant for the other backend is said to be ignored. An unknown key is an error (torchrun
// ignores it, so a misspelt key silently keeps the default); `heartbeat`, the name of PyTorch's
// docstring that its code never reads, is accepted with a note.
void read_rdzv_conf(const std::string& raw_text, LaunchConfig& config, bool multi_node_static,
                    std::vector<std::string>& notes) {
  const bool c10d = config.rdzv_backend == RendezvousBackend::kC10d;
  config.join_timeout = std::chrono::seconds(c10d ? 600 : 900);
  const std::string text = unquoted(raw_text);
  const auto refuse = [&](const std::string& why) { throw UsageError(with_value("--rdzv_conf", raw_text) + ": " + why); };
  const auto note = [&](const std::string& why) { notes.push_back("cpprun: " + with_value("--rdzv_conf", raw_text) + ": " + why); };
  bool join_timeout_given = false;
  bool timeout_given = false;
  // Split by hand: getline drops a trailing empty item, which torchrun refuses as it refuses ",,".
  std::vector<std::string> items;
  for (std::size_t start = 0; !text.empty();) {
    const std::size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (std::string item : items) {
    item = unquoted(item);
    const auto eq = item.find('=');
    const std::string key = unquoted(item.substr(0, eq));
    if (key.empty()) {
      const std::string what = item.empty() ? "an empty item (two commas in a row, or one at an end)"
                                            : "'" + item + "', an item without a key";
      refuse(what + "; write KEY=VALUE,KEY=VALUE, as torchrun requires (\"must be in format "
             "<key1>=<value1>,...,<keyN>=<valueN>\")");
    }
    const std::string value = eq == std::string::npos ? std::string() : unquoted(item.substr(eq + 1));
    static const std::vector<std::string> kC10dSeconds = {"join_timeout", "last_call_timeout", "close_timeout",
                                                         "heartbeat_timeout", "read_timeout", "keep_alive_interval"};
    const bool seconds_key = key == "timeout" || key == "heartbeat" ||
                             std::find(kC10dSeconds.begin(), kC10dSeconds.end(), key) != kC10dSeconds.end();
    const bool other_key = key == "is_host" || key == "store_type" || key == "keep_alive_max_attempt" ||
                           key == "cas_backoff_max_seconds" || key == "rank";
    if (!seconds_key && !other_key) {
      refuse("'" + item + "' is not a setting of " + backend_name(config.rdzv_backend) +
             " rendezvous; cpprun knows torchrun's: timeout=SECONDS (static's join wait, default 900), "
             "join_timeout=SECONDS (c10d's, default 600), last_call_timeout=SECONDS, is_host=0|1; close_timeout, "
             "heartbeat_timeout, read_timeout, keep_alive_interval, keep_alive_max_attempt, "
             "cas_backoff_max_seconds and store_type are checked and unused, e.g. --rdzv_conf " +
             std::string(c10d ? "join_timeout=300" : "timeout=300"));
    }
    if (value.empty()) refuse("'" + key + "' has no value; write " + key + "=VALUE (torchrun: \"must have a value specified\")");
    if (key == "is_host") {
      config.is_host = read_bool(value);
      if (!config.is_host) {
        refuse("is_host=" + value + " is not a boolean; write is_host=1 (this agent hosts the rendezvous) or is_host=0");
      }
      if (!c10d) config.is_host.reset();
      continue;
    }
    if (key == "store_type") {
      std::string lower;
      for (char c : value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower == "tcp") continue;
      if (lower == "file" && c10d) {
        refuse("store_type=file (torchrun's FileStore at the --rdzv_endpoint path) is not implemented: cpprun's "
               "agents meet over TCP at --rdzv_endpoint=HOST:PORT; drop store_type or write store_type=tcp");
      }
      if (lower != "file") refuse("store_type=" + value + ": expected tcp or file, as torchrun");
      continue;
    }
    if (key == "rank") continue;  // the launcher's (--node_rank), as torchrun overwrites it
    if (key == "keep_alive_max_attempt") {
      if (!int_in_range(value, std::numeric_limits<int>::min(), std::numeric_limits<int>::max())) {
        refuse("keep_alive_max_attempt=" + value + ": expected a whole number, as torchrun");
      }
      continue;
    }
    if (key == "cas_backoff_max_seconds") {
      double seconds = 0;
      if (!read_double(value, seconds) || seconds < 0) {
        refuse("cas_backoff_max_seconds=" + value + ": expected a finite number of seconds >= 0, as torchrun");
      }
      continue;
    }
    const std::chrono::milliseconds seconds = parse_seconds("--rdzv_conf " + key, value);
    if (key == "read_timeout" && seconds.count() == 0) refuse("the read timeout must be above 0 seconds, as torchrun's");
    // torchrun's RendezvousTimeout refuses a join, last-call, close or heartbeat timeout <= 0.
    if (c10d && (key == "last_call_timeout" || key == "close_timeout" || key == "heartbeat_timeout") &&
        seconds.count() == 0) {
      refuse("the " + key.substr(0, key.size() - 8) + " timeout must be above 0 seconds, as torchrun's (\"must be positive\")");
    }
    const bool join = c10d ? key == "join_timeout" : key == "timeout";
    if (join && seconds.count() == 0) refuse("the join timeout must be above 0 seconds");
    if (join) config.join_timeout = seconds;
    if (c10d && key == "last_call_timeout") config.last_call_timeout = seconds;
    join_timeout_given = join_timeout_given || key == "join_timeout";
    timeout_given = timeout_given || key == "timeout";
    if (key == "heartbeat") {
      note("torchrun reads heartbeat_timeout, not heartbeat (the name in PyTorch's create_handler docstring): "
           "ignored, as torchrun ignores it");
    }
  }
  if (c10d && timeout_given && !join_timeout_given) {
    note("timeout is the static rendezvous's join wait; c10d's is join_timeout (default 600 s), as torchrun's: "
         "timeout is ignored, write join_timeout=SECONDS");
  }
  if (multi_node_static && join_timeout_given && !timeout_given) {
    note("join_timeout is c10d's; the static rendezvous waits timeout=SECONDS (default 900 s), as torchrun's: "
         "join_timeout is ignored, write timeout=SECONDS");
  }
}

OutputOptions validate_output(const RawOptions& raw, int nproc_per_node) {
  OutputOptions output{parse_std_spec("--redirects", raw.redirects, nproc_per_node),
                       parse_std_spec("--tee", raw.tee, nproc_per_node),
                       parse_local_ranks_filter(raw.local_ranks_filter, nproc_per_node),
                       raw.log_dir,
                       parse_duplicate_filters(raw.duplicate_stdout_filters),
                       parse_duplicate_filters(raw.duplicate_stderr_filters)};
  // Files without --log_dir go to a temp dir that stays, as torchrun's (run_directory.h).
  if (output.log_dir == kNullLogDir) {
    // torchrun's DefaultLogsSpecs.reify: each worker's output stays on the console and no file is
    // written; the filters' files would be /dev/null/filtered_*.log (torchrun fails on them): none.
    std::fill(output.redirects.begin(), output.redirects.end(), StdStreams::kNone);
    std::fill(output.tee.begin(), output.tee.end(), StdStreams::kNone);
    // Its devnull branch applies no --local_ranks_filter: every rank's output reaches the console.
    std::fill(output.shown.begin(), output.shown.end(), true);
    if (!output.duplicate_stdout_filters.empty() || !output.duplicate_stderr_filters.empty()) {
      throw UsageError("--duplicate_stdout_filters/--duplicate_stderr_filters write filtered_*.log files into the "
                       "run's log dir, and --log_dir=/dev/null writes no files (torchrun fails opening "
                       "/dev/null/filtered_stdout.log); give a --log_dir, or drop the filters");
    }
  }
  return output;
}

// The node counts and where the nodes meet; c10d ignores the static options, as torchrun's does.
void validate_rendezvous(const RawOptions& raw, const HostFacts& host, LaunchConfig& config,
                         std::vector<std::string>& notes) {
  // torchrun's --standalone overrides the backend and endpoint; here it means one node on a private port.
  config.rdzv_backend = config.standalone ? RendezvousBackend::kStatic : parse_rdzv_backend(raw.rdzv_backend);
  const NodeRange nodes = parse_nnodes(raw.nnodes);
  if (config.standalone && nodes.max > 1) {
    throw UsageError("--standalone runs a single node on a private port; it cannot be combined with --nnodes=" +
                     raw.nnodes + ". Give node 0's address with --master_addr/--master_port on every node instead");
  }
  read_rdzv_conf(raw.rdzv_conf, config, config.rdzv_backend == RendezvousBackend::kStatic && nodes.max > 1, notes);
  config.min_nodes = nodes.min;
  config.max_nodes = nodes.max;
  config.nnodes = nodes.max;
  if (config.rdzv_backend == RendezvousBackend::kC10d) {
    if (!int_in_range(raw.node_rank, 0, std::numeric_limits<int>::max())) {
      throw UsageError(with_value("--node_rank", raw.node_rank) + ": expected a whole number >= 0 (with "
                       "--rdzv_backend=c10d it is ignored: nodes are numbered in the order they join)");
    }
    config.master_addr = "localhost";  // torchrun's endpoint when none is given
    config.master_port = 29400;
    config.master_addr_flag = "the host of the default --rdzv_endpoint=localhost:29400";
    if (!raw.rdzv_endpoint.empty()) read_rdzv_endpoint(raw.rdzv_endpoint, 29400, config, 0);
    if (config.master_port == 0) {
      // torchrun's "--rdzv-endpoint=localhost:0 --nnodes=1: let torchrun pick a free random port"
      // (its --standalone is this): one node, nobody else to meet, so cpprun's single-node launch
      // on a port the kernel picks, at that host, under this --rdzv_id.
      if (nodes.max > 1) {
        throw UsageError(with_value("--rdzv_endpoint", raw.rdzv_endpoint) + ": port 0 lets one node pick a free "
                         "port, which the other nodes of --nnodes=" + raw.nnodes + " could not know; give the "
                         "rendezvous port, the same on every node (e.g. --rdzv_endpoint=" +
                         endpoint_text(config.master_addr, 29400) + ")");
      }
      if (config.is_host == false) {  // torchrun connects to port 0 and fails with a traceback
        throw UsageError(with_value("--rdzv_endpoint", raw.rdzv_endpoint) + " with --rdzv_conf is_host=0: port 0 "
                         "means this agent picks a port and hosts the rendezvous itself, and is_host=0 says "
                         "another agent hosts it; drop is_host=0, or give that agent's port (e.g. "
                         "--rdzv_endpoint=" + endpoint_text(config.master_addr, 29400) + ")");
      }
      config.rdzv_backend = RendezvousBackend::kStatic;
      config.node_rank = 0;
      config.picked_port = true;
      try {
        config.master_port = host.pick_free_port();
      } catch (const std::system_error& e) {
        throw UsageError(with_value("--rdzv_endpoint", raw.rdzv_endpoint) + ": could not find a free port: " +
                         e.what() + "; give a port instead");
      }
    }
    return;
  }
  if (nodes.min != nodes.max) {
    throw UsageError(with_value("--nnodes", raw.nnodes) +
                     ": a range of nodes needs the dynamic rendezvous: add --rdzv_backend=c10d "
                     "--rdzv_endpoint=HOST:PORT --rdzv_id=ID on every node; the static backend runs a fixed "
                     "number of nodes (--nnodes=" + std::to_string(nodes.max) + ")");
  }
  config.node_rank = parse_int_in_range("--node_rank", raw.node_rank, 0, config.nnodes - 1,
                                        "this node's rank among --nnodes=" + raw.nnodes, 0);
  // torchrun 2.x: --standalone, or one node with neither --master_port nor --rdzv_endpoint, runs on a
  // free port under a random run id (a uuid4, replacing --rdzv_id), so default jobs on one host never collide.
  config.picked_port = config.standalone || (config.nnodes == 1 && !raw.master_port_given && raw.rdzv_endpoint.empty());
  if (raw.master_addr.empty() && !config.standalone) {
    throw UsageError("--master_addr='': expected a host name or IP address (e.g. --master_addr=127.0.0.1)");
  }
  if (config.picked_port) {
    const std::string why = config.standalone ? "--standalone" : "one node without --master_port";
    try {
      config.master_port = host.pick_free_port();
      config.run_id = host.random_run_id();
    } catch (const std::system_error& e) {
      throw UsageError(why + ": could not find a free port or make a run id: " + e.what() +
                       "; pass --master_port=PORT instead");
    }
    if (config.standalone) {
      config.master_addr = "127.0.0.1";
      config.master_addr_flag = "--standalone's 127.0.0.1";
      return;
    }
  }
  config.master_addr = raw.master_addr;
  config.master_addr_flag = with_value("--master_addr", raw.master_addr);
  // torchrun's help writes an IPv6 --master_addr in brackets ([0:0:0:0:0:0:0:1]); MASTER_ADDR has none.
  if (config.master_addr.size() > 2 && config.master_addr.front() == '[' && config.master_addr.back() == ']') {
    config.master_addr = config.master_addr.substr(1, config.master_addr.size() - 2);
  }
  if (config.picked_port) return;
  config.master_port = parse_int_in_range("--master_port", raw.master_port, 1, 65535, "a TCP port", 29500);
  // torchrun's static backend meets at the endpoint, and its workers use that store.
  if (!raw.rdzv_endpoint.empty()) read_rdzv_endpoint(raw.rdzv_endpoint, 29500, config);
}

void validate(const RawOptions& raw, const HostFacts& host, LaunchConfig& config, std::vector<std::string>& notes) {
  config.nproc_per_node = parse_nproc_per_node(raw.nproc_per_node, host);
  config.output = validate_output(raw, config.nproc_per_node);
  validate_rendezvous(raw, host, config, notes);
  config.max_restarts =
      parse_int_in_range("--max_restarts", raw.max_restarts, 0, 1000000, "how often to restart", 3);
  config.restart_backoff = parse_restart_backoff(raw.restart_backoff);
  if (!raw.shutdown_timeout.empty()) {
    config.shutdown_timeout = parse_seconds("--shutdown_timeout", raw.shutdown_timeout);
  }
  // torchrun's agent asserts monitor_interval > 0 (WorkerSpec.__post_init__): refused as it
  // refuses it. cpprun reacts to a worker's exit at once; the value paces the D-state check alone.
  if (!read_double(raw.monitor_interval, config.monitor_interval) || config.monitor_interval <= 0) {
    throw UsageError(with_value("--monitor_interval", raw.monitor_interval) +
                     ": expected a number of seconds above 0, as torchrun (cpprun reads it only as the period of the "
                     "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT check; e.g. --monitor_interval=0.1)");
  }
  // At least 1 ms: poll() takes milliseconds; at most a day, which no check needs to wait longer than.
  config.uninterruptible_state.interval = std::chrono::milliseconds(
      static_cast<long long>(std::ceil(std::min(config.monitor_interval, 86400.0) * 1000)));
}

// One of `choices`, as argparse's choices=[...] checks it.
void check_choice(const std::string& flag, const std::string& value, const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw UsageError(with_value(flag, value) + ": expected one of " + list + " (as torchrun's)");
}

// torchrun's --signals_to_handle: names of signals, comma-separated ("SIGTERM,SIGUSR1"), each looked
// up as getattr(signal, NAME) and given the agent's handler, which ends the job (multiprocessing/api.py).
// cpprun handles SIGINT, SIGTERM, SIGHUP, SIGQUIT, and SIGUSR1/SIGUSR2 as far as listed (signal_relay.h);
// another real signal listed is exported but not caught, said in a note. A name that is not a signal's
// is a note too: torchrun warns ("Failed to register signal handler") and runs the job. SIGKILL and
// SIGSTOP cannot be caught: torchrun fails starting its workers (signal.signal's OSError), and cpprun
// refuses them.
std::vector<std::string> signal_list_notes(const std::string& text) {
  static const std::vector<std::string> kHandled = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"};
  // The other names of Python's signal module on Linux (what torchrun's getattr finds).
  static const std::vector<std::string> kOther = {
      "SIGABRT", "SIGALRM", "SIGBUS",  "SIGCHLD", "SIGCLD",    "SIGCONT",  "SIGFPE",   "SIGILL",  "SIGIO",   "SIGIOT",
      "SIGPIPE", "SIGPOLL", "SIGPROF", "SIGPWR",  "SIGRTMAX",  "SIGRTMIN", "SIGSEGV",  "SIGSTKFLT", "SIGSYS", "SIGTRAP",
      "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG",  "SIGVTALRM", "SIGWINCH", "SIGXCPU",  "SIGXFSZ"};
  const auto among = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::vector<std::string> notes;
  std::istringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    item = unquoted(item);
    if (among(kHandled, item)) continue;
    if (item == "SIGKILL" || item == "SIGSTOP") {
      throw UsageError(with_value("--signals_to_handle", text) + ": " + item + " cannot be caught by any process "
                       "(torchrun fails starting its workers: \"OSError: [Errno 22] Invalid argument\"); drop it");
    }
    if (among(kOther, item)) {
      notes.push_back("cpprun: " + with_value("--signals_to_handle", text) + ": " + item + " is exported in "
                      "TORCHELASTIC_SIGNALS_TO_HANDLE but not caught: a " + item + " sent to cpprun has its default "
                      "effect, where torchrun's agent would end the job on it as on SIGTERM. cpprun ends the job on "
                      "SIGINT, SIGTERM, SIGHUP and SIGQUIT, and on SIGUSR1 and SIGUSR2 if listed");
      continue;
    }
    notes.push_back("cpprun: " + with_value("--signals_to_handle", text) + ": '" + item +
                    "' is not a signal name (write names like SIGTERM,SIGUSR1); ignored, as torchrun ignores it "
                    "with a warning. cpprun forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to "
                    "the workers whatever the list (SIGUSR1 and SIGUSR2 end the job only if listed)");
  }
  return notes;
}

// --virtual_local_rank gives local rank i the i-th GPU of the parent's CUDA_VISIBLE_DEVICES (or
// HIP_VISIBLE_DEVICES): there must be one per worker, as torchrun checks when it starts them.
void check_virtual_local_rank(const LaunchConfig& config, const EnvLookup& env) {
  if (!config.virtual_local_rank) return;
  const std::optional<std::string> hip = env("HIP_VISIBLE_DEVICES");
  const std::string name = hip && !hip->empty() ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES";
  const std::optional<std::string> visible = hip && !hip->empty() ? hip : env("CUDA_VISIBLE_DEVICES");
  if (!visible) return;
  const auto listed = static_cast<int>(std::count(visible->begin(), visible->end(), ',')) + 1;
  if (listed >= config.nproc_per_node) return;
  throw UsageError("--virtual_local_rank gives each worker one GPU of " + name + "=" + *visible + ", which lists " +
                   std::to_string(listed) + " for --nproc_per_node=" + std::to_string(config.nproc_per_node) +
                   "; list one per worker, or run fewer workers");
}

// torchrun looks --logs_specs NAME up among the torchrun.logs_specs entry points, where PyTorch
// installs only "default" (DefaultLogsSpecs), and raises ValueError for a name none installs, an
// empty one included. cpprun loads no Python plugins: "default" is all there is.
void check_logs_specs(const CLI::App& app, const std::string& name) {
  if ((app.get_option("--logs_specs")->count() == 0 && name.empty()) || name == "default") return;
  throw UsageError(with_value("--logs_specs", name) + ": not a LogsSpecs entry point cpprun has; it has only torchrun's "
                   "default, --logs_specs=default (the logs go where torchrun's DefaultLogsSpecs puts them). torchrun "
                   "also refuses a name no installed Python package provides (\"Could not find entrypoint under "
                   "'torchrun.logs_specs[" + name + "]' key\"), and cpprun loads no Python plugins: drop the option "
                   "or write --logs_specs=default");
}

// torchrun options cpprun accepts but cannot honour: said once on stderr, when they ask for something.
std::vector<std::string> ignored_option_notes(const RawOptions& raw) {
  std::vector<std::string> notes;
  const auto note = [&](const std::string& text) { notes.push_back("cpprun: " + text); };
  if (!raw.numa_binding.empty()) {
    note(with_value("--numa_binding", raw.numa_binding) + " is accepted and ignored: cpprun does not bind workers "
         "to CPUs (bind them yourself, e.g. numactl in a wrapper script)");
  }
  if (raw.event_log_handler != "null") {
    note(with_value("--event_log_handler", raw.event_log_handler) + " is accepted and ignored: cpprun records no "
         "torchelastic events");
  }
  return notes;
}

// --print_completion SHELL: a completion script for cpprun's options (torchrun's needs the shtab package).
std::string completion_script(const std::string& shell, const std::vector<OptionSpelling>& spellings) {
  std::string words;
  for (const OptionSpelling& spelling : spellings) words += (words.empty() ? "" : " ") + spelling.name;
  if (shell == "tcsh") {
    throw UsageError("--print_completion=tcsh: cpprun prints completion scripts for bash and zsh only");
  }
  std::string script;
  if (shell == "zsh") script = "autoload -U +X bashcompinit && bashcompinit\n";
  return script + "complete -o default -W \"" + words + "\" cpprun\n";
}

// Writes the scheduler's values into the multi-node options that neither the command line nor
// PET_<NAME> gave, and returns the line saying so; nothing for --standalone or a one-node job.
std::string apply_scheduler_defaults(const CLI::App& app, const EnvLookup& env, bool standalone, RawOptions& raw) {
  const auto given = [&](const char* name) { return app.get_option(name)->count() > 0; };
  const bool nnodes_given = given("--nnodes");
  const bool node_rank_given = given("--node_rank");
  const bool addr_given = given("--master_addr") || given("--rdzv_endpoint");
  const bool port_given = given("--master_port") || given("--rdzv_endpoint");
  // c10d meets at --rdzv_endpoint and numbers the nodes itself, like torchrun's.
  if (standalone || raw.rdzv_backend == "c10d") return {};
  if (nnodes_given && node_rank_given && addr_given && port_given) return {};
  const std::optional<SchedulerDefaults> d = derive_from_scheduler(env);
  if (!d) return {};
  const int nnodes = nnodes_given ? parse_nnodes(raw.nnodes).max : d->nnodes;
  if (nnodes <= 1) return {};
  std::string taken;
  const auto take = [&](std::string& option, const std::string& flag, const std::string& value) {
    option = value;
    taken += " " + with_value(flag, value);
  };
  if (!nnodes_given) take(raw.nnodes, "--nnodes", std::to_string(d->nnodes));
  if (!node_rank_given) {
    if (d->node_rank >= nnodes) {
      throw UsageError(d->node_rank_var + "=" + std::to_string(d->node_rank) + " (from " + d->source +
                       ") is not a node rank of --nnodes=" + raw.nnodes + "; pass --node_rank explicitly too");
    }
    take(raw.node_rank, "--node_rank", std::to_string(d->node_rank));
  }
  if (!addr_given) {
    if (!d->master_addr) {
      throw UsageError(d->source + " (" + d->nnodes_var + "=" + std::to_string(d->nnodes) +
                       ") does not say where node 0 is: set MASTER_ADDR=HOST in the environment of every "
                       "cpprun, or pass --master_addr=HOST (node 0's address)");
    }
    take(raw.master_addr, "--master_addr", *d->master_addr);
  }
  if (!port_given && d->master_port) take(raw.master_port, "--master_port", std::to_string(*d->master_port));
  return taken.empty() ? std::string() : "cpprun: from " + d->source + ":" + taken;
}

// At most one of torchrun's three ways to say how PROGRAM runs (program_command.h).
ProgramMode program_mode(const RawOptions& raw) {
  // torchrun's config_from_args: --run_path comes first and wins over -m and --no_python, which it
  // then does not look at (not even at their contradiction).
  if (raw.run_path) return ProgramMode::kRunPath;
  if (raw.no_python && raw.module) {
    throw UsageError("--no_python and -m/--module contradict each other: -m runs a Python module, --no_python "
                     "runs PROGRAM without Python; give one");
  }
  if (raw.no_python) return ProgramMode::kNoPython;
  if (raw.module) return ProgramMode::kModule;
  return ProgramMode::kByName;
}

// Every spelling CLI11 knows, with its dashes: for expand_option_prefixes and "did you mean".
std::vector<OptionSpelling> option_spellings(const CLI::App& app) {
  // The long names torchrun 2.15's argparse lacks (either spelling): cpprun's own options and aliases.
  static const std::vector<std::string> kCpprunOnly = {"restart_backoff", "run_id", "job_secret_file",
                                                       "no_job_secret", "dry_run"};
  std::vector<OptionSpelling> spellings;
  int id = 0;
  for (const CLI::Option* option : app.get_options()) {
    const bool takes_value = option->get_items_expected_min() > 0;
    const std::string value_name = takes_value ? option->get_type_name() : "";
    for (const std::string& name : option->get_lnames()) {
      std::string underscored = name;
      std::replace(underscored.begin(), underscored.end(), '-', '_');
      const bool torchrun = std::find(kCpprunOnly.begin(), kCpprunOnly.end(), underscored) == kCpprunOnly.end();
      spellings.push_back({"--" + name, id, takes_value, torchrun, value_name});
    }
    for (const std::string& name : option->get_snames()) {
      spellings.push_back({"-" + name, id, takes_value, true, value_name});
    }
    ++id;
  }
  return spellings;
}

// prefix_command() hands back everything from the first argument CLI11 did not recognise; that is
// PROGRAM, unless it is an option we do not have.
void take_program(std::vector<std::string> rest, const std::vector<OptionSpelling>& spellings,
                  LaunchConfig& config) {
  const bool after_separator = !rest.empty() && rest.front() == "--";
  if (after_separator) rest.erase(rest.begin());
  if (rest.empty()) {
    throw UsageError(
        "missing PROGRAM: name the program to launch after the options, e.g. "
        "`cpprun --nproc_per_node=2 ./train --lr 0.1`\nRun with --help for more information.");
  }
  const std::string& first = rest.front();
  if (!after_separator && first.size() > 1 && first[0] == '-') {
    const std::string typed = first.substr(0, first.find('='));
    std::vector<std::string> known;
    for (const OptionSpelling& spelling : spellings) known.push_back(spelling.name);
    const std::optional<std::string> suggestion = suggest_option(typed, known);
    throw UsageError("unknown option " + typed + (suggestion ? "; did you mean " + *suggestion + "?" : "") +
                     " (before PROGRAM only cpprun's options are allowed; put -- before PROGRAM "
                     "if its name starts with '-')\nRun with --help for more information.");
  }
  config.program = first;
  config.program_args.assign(rest.begin() + 1, rest.end());
}

}  // namespace

std::string with_value(const std::string& name, const std::string& value) {
  return name + "=" + (value.empty() ? "''" : value);
}

std::optional<int> int_in_range(const std::string& raw, long min, long max) {
  // Python's int(), which torchrun's type=int and its own int() calls use: ASCII whitespace around
  // (str.isspace: also \x1c-\x1f), one sign, digits with single underscores between them ("1_000").
  static const char kSpace[] = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  const auto first = raw.find_first_not_of(kSpace);
  if (first == std::string::npos) return std::nullopt;
  const std::string text = raw.substr(first, raw.find_last_not_of(kSpace) - first + 1);
  std::string digits;
  std::size_t i = text[0] == '+' || text[0] == '-' ? 1 : 0;
  if (i == 1) digits += text[0];
  for (const std::size_t start = i; i < text.size(); ++i) {
    const bool digit = std::isdigit(static_cast<unsigned char>(text[i])) != 0;
    const bool joint = text[i] == '_' && i > start && i + 1 < text.size() &&
                       std::isdigit(static_cast<unsigned char>(text[i - 1])) != 0 &&
                       std::isdigit(static_cast<unsigned char>(text[i + 1])) != 0;
    if (!digit && !joint) return std::nullopt;
    if (digit) digits += text[i];
  }
  if (digits.empty() || digits == "+" || digits == "-") return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(digits.c_str(), &end, 10);
  if (errno != 0 || end != digits.c_str() + digits.size() || value < min || value > max) return std::nullopt;
  return static_cast<int>(value);
}

bool is_multi_node(const LaunchConfig& config) {
  return rendezvous_settings(config).multi_node();
}

std::string endpoint_text(const LaunchConfig& config) { return endpoint_text(config.master_addr, config.master_port); }

// Field by field: neighbouring fields share types (min/max nodes, the timeouts), so an aggregate
// in declaration order would compile wrong after a reordering.
RendezvousSettings rendezvous_settings(const LaunchConfig& c) {
  RendezvousSettings s;
  s.backend = c.rdzv_backend;
  s.min_nodes = c.min_nodes;
  s.max_nodes = c.max_nodes;
  s.node_rank = c.rdzv_backend == RendezvousBackend::kStatic ? c.node_rank : -1;
  s.host = c.master_addr;
  s.host_flag = c.master_addr_flag;
  s.port = c.master_port;
  s.join_timeout = c.join_timeout;
  s.last_call_timeout = c.last_call_timeout;
  s.is_host = c.is_host;
  s.max_restarts = c.max_restarts;
  s.restart_backoff = c.restart_backoff;
  s.shutdown_timeout = c.shutdown_timeout;
  s.run_id = c.run_id;
  s.shape = {c.nproc_per_node, c.role};
  s.job_secret = c.job_secret;
  s.job_secret_note = c.job_secret_note;
  s.local_addr = c.local_addr;
  s.agent_store = c.agent_store;
  return s;
}

ParsedCommandLine parse_launch_config(const std::vector<std::string>& args, const HostFacts& host,
                                      const EnvLookup& env) {
  CLI::App app{
      "Runs PROGRAM as --nproc_per_node workers with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, "
      "...), stops them all when one fails, and restarts them up to --max_restarts times. With --nnodes=K, run "
      "it on each of K nodes; with --rdzv_backend=c10d and --nnodes=MIN:MAX, nodes may come and go.",
      "cpprun"};
  app.prefix_command();
  const auto formatter = std::make_shared<CpprunFormatter>();
  app.formatter(formatter);
  // argparse semantics, which torchrun users rely on: a repeated option's last value wins.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(
      "Everything from PROGRAM on is passed to it untouched. As with torchrun, an option may also come from "
      "PET_<NAME>, and a long option may be cut to an unambiguous prefix (--nproc=2). Each line of the workers' "
      "output is prefixed with its rank ([rank3]: ...).");

  RawOptions raw;
  ParsedCommandLine result;
  LaunchConfig& config = result.config;
  // Each option is also spelt with dashes for its underscores and read from PET_<NAME>, as torchrun's
  // argparse options are: --nproc_per_node is --nproc-per-node and PET_NPROC_PER_NODE too.
  const auto spellings = [](const std::string& names) {
    std::string dashed = names;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    return dashed == names ? names : names + "," + dashed;
  };
  const auto env_name = [](const std::string& names) {  // from the first long name
    const std::size_t start = names.find("--") + 2;
    std::string env = "PET_" + names.substr(start, names.find(',', start) - start);
    std::transform(env.begin(), env.end(), env.begin(), [](unsigned char c) { return std::toupper(c); });
    return env;
  };
  auto option = [&](const std::string& names, std::string& value, const std::string& type, const std::string& help) {
    app.add_option(spellings(names), value, help)->type_name(type)->envname(env_name(names))->capture_default_str();
  };
  auto flag = [&](const std::string& names, bool& value, const std::string& help) {  // Note [A flag from PET_<NAME>]
    formatter->env_flags.push_back({app.add_flag(spellings(names), value, help), env_name(names), &value});
  };
  option("--nproc_per_node", raw.nproc_per_node, "N|auto|cpu|gpu",
         "Workers on this node: N, cpu (one per CPU this process may run on), gpu (one per GPU) or auto (gpu if "
         "any, else cpu).");
  option("--nnodes", raw.nnodes, "N|MIN:MAX",
         "Nodes, each running cpprun; c10d: MIN:MAX, from MAX or from MIN after last_call_timeout.");
  option("--node_rank", raw.node_rank, "INT", "Static rendezvous: this node's rank; node 0 hosts the rendezvous.");
  option("--master_addr", raw.master_addr, "HOST", "Node 0's address (MASTER_ADDR). Ignored by c10d.");
  option("--master_port", raw.master_port, "PORT", "Node 0's TCPStore port (MASTER_PORT). Ignored by c10d.");
  option("--rdzv_backend", raw.rdzv_backend, "static|c10d",
         "static: fixed nodes meeting at --master_addr:--master_port. c10d: torchrun's dynamic rendezvous at "
         "--rdzv_endpoint; nodes may join and leave (not counted against --max_restarts).");
  option("--rdzv_endpoint", raw.rdzv_endpoint, "HOST[:PORT]",
         "static: node 0's --master_addr[:--master_port]. c10d: the rendezvous (default localhost:29400).");
  option("--rdzv_conf", raw.rdzv_conf, "KEY=VALUE,...",
         "static: timeout=SECONDS (join wait, default 900); c10d: join_timeout=SECONDS (default 600), "
         "last_call_timeout=SECONDS (default 30), is_host=1|0.");
  flag("--standalone", config.standalone, "One node on a private port: 127.0.0.1 and a free MASTER_PORT.");
  option("--max_restarts", raw.max_restarts, "INT", "Restarts of the workers after a failure.");
  option("--restart_backoff", raw.restart_backoff, "INITIAL[:MAX]",
         "Seconds before a restart: INITIAL, doubling with each failure in a row up to MAX (default 30).");
  option("--shutdown_timeout", raw.shutdown_timeout, "SECONDS",
         "Seconds from SIGTERM to SIGKILL; default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5 (torchrun: 30).");
  option("--rdzv_id,--run_id", config.run_id, "ID", "Job id (TORCHELASTIC_RUN_ID), the same on every node.");
  option("--role", config.role, "NAME", "Worker role (ROLE_NAME).");
  option("--monitor_interval", raw.monitor_interval, "SECONDS",
         "How often the workers' states are read for TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT; otherwise unused.");
  flag("--no_python", raw.no_python, "Run PROGRAM directly, even PROGRAM.py.");
  option("-r,--redirects", raw.redirects, "0-3|LOCAL_RANK:0-3,...",
         "Workers' output to files in --log_dir, not the console: 1 stdout, 2 stderr, 3 both; or a map like 0:1,1:3.");
  option("-t,--tee", raw.tee, "0-3|LOCAL_RANK:0-3,...", "Like --redirects, but the console gets the output too.");
  option("--log_dir", raw.log_dir, "DIR",
         "Workers' files in DIR/RUN_ID_XXXXXXXX/attempt_N/LOCAL_RANK/ (a kept temp dir for --redirects/--tee "
         "without it).");
  option("--local_ranks_filter", raw.local_ranks_filter, "LOCAL_RANK,...", "The local ranks shown on the console.");
  flag("--dry_run", config.dry_run, "Print each worker's command line and environment; start nothing.");
  flag("-m,--module", raw.module, "PROGRAM is a Python module: workers run `python -u -m PROGRAM`.");
  flag("--run_path", raw.run_path, "PROGRAM is a file of Python code, run with runpy.run_path whatever its name.");
  option("--job_secret_file", raw.job_secret_file, "PATH",
         "Multi-node: the job's secret, the same on every node (else $CPPRUN_JOB_SECRET); 16 characters or more.");
  flag("--no_job_secret", config.no_job_secret,
       "Multi-node without a secret: anyone who reaches the agents' ports can join or steer the job.");
  option("--log_line_prefix_template", raw.log_line_prefix_template, "TEMPLATE",
         "Console line prefix instead of [rankN]: , with ${role_name}, ${rank}, ${local_rank}, ${hostname}.");
  flag("--virtual_local_rank", config.virtual_local_rank,
       "LOCAL_RANK=0 for every worker; worker i sees only GPU i (CUDA_VISIBLE_DEVICES).");
  option("--signals_to_handle", raw.signals_to_handle, "SIG,...",
         "Exported as TORCHELASTIC_SIGNALS_TO_HANDLE; SIGUSR1/SIGUSR2 listed end the job as SIGTERM does, "
         "unlisted they are forwarded and the job runs on; SIGINT, SIGTERM, SIGHUP, SIGQUIT always end it.");
  option("--start_method", raw.start_method, "spawn|fork|forkserver",
         "Accepted for torchrun compatibility; cpprun always fork-execs PROGRAM.");
  option("--local_addr", raw.local_addr, "HOST",
         "c10d: this node's address; if it hosts the rendezvous, every worker's MASTER_ADDR. Static: unused.");
  option("--event_log_handler", raw.event_log_handler, "NAME", "Accepted for torchrun compatibility; unused.");
  option("--duplicate_stdout_filters", raw.duplicate_stdout_filters, "TEXT,...",
         "--tee'd stdout lines holding any TEXT also go to the attempt's filtered_stdout.log (,, is a comma).");
  option("--duplicate_stderr_filters", raw.duplicate_stderr_filters, "TEXT,...",
         "The same for stderr: filtered_stderr.log.");
  option("--logs_specs", raw.logs_specs, "default",
         "torchrun's default LogsSpecs, the only one (torchrun's others are Python plugins); other names are refused.");
  option("--numa_binding", raw.numa_binding, "node|socket|exclusive|core-complex",
         "Accepted for torchrun compatibility; unused.");
  option("--print_completion", raw.print_completion, "bash|zsh", "Print a shell completion script and exit.");
  // torchrun gives these three no env action (run.py): PET_LOGS_SPECS, PET_NUMA_BINDING and
  // PET_PRINT_COMPLETION are not read, as torchrun does not read them.
  for (const char* no_env : {"--logs_specs", "--numa_binding", "--print_completion"}) app.get_option(no_env)->envname("");

  const std::vector<OptionSpelling> known = option_spellings(app);
  const std::vector<std::string> expanded = expand_option_prefixes(args, known);
  try {
    // CLI11's vector overload consumes arguments from the back.
    std::vector<std::string> reversed(expanded.rbegin(), expanded.rend());
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.outcome = CliOutcome::kShowHelp;
    result.help_text = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + "\nRun with --help for more information.");
  }
  for (const CpprunFormatter::EnvFlag& flag : formatter->env_flags) {
    const std::optional<std::string> text = flag.option->count() == 0 ? env(flag.variable) : std::nullopt;
    if (text && !text->empty()) *flag.value = flag_from_env(flag.variable, *text);
  }
  if (!raw.print_completion.empty()) {
    check_choice("--print_completion", raw.print_completion, {"bash", "zsh", "tcsh"});
    result.outcome = CliOutcome::kShowHelp;
    result.help_text = completion_script(raw.print_completion, known);
    return result;
  }
  result.scheduler_note = apply_scheduler_defaults(app, env, config.standalone, raw);
  raw.master_port_given = app.get_option("--master_port")->count() > 0 || raw.master_port != "29500";
  if (raw.shutdown_timeout.empty()) {
    if (const std::optional<std::string> from_env = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
      if (!read_seconds(*from_env)) {
        throw UsageError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=" + *from_env +
                         ": expected a number of seconds from 0 to 86400 (or pass --shutdown_timeout)");
      }
      raw.shutdown_timeout = *from_env;
    }
  }
  std::vector<std::string> conf_notes;
  validate(raw, host, config, conf_notes);
  check_choice("--start_method", raw.start_method, {"spawn", "fork", "forkserver"});
  if (!raw.numa_binding.empty()) {
    check_choice("--numa_binding", raw.numa_binding, {"node", "socket", "exclusive", "core-complex"});
  }
  check_logs_specs(app, raw.logs_specs);
  config.signals_to_handle = raw.signals_to_handle;
  config.local_addr = raw.local_addr;
  config.log_line_prefix_template = raw.log_line_prefix_template;
  if (config.log_line_prefix_template.empty()) {
    config.log_line_prefix_template = env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").value_or("");
  }
  config.hostname = host.hostname;
  check_virtual_local_rank(config, env);
  // Off unless set to a positive number, never an error: torchrun's rule (uninterruptible_state_settings.h);
  // a value that leaves it off is said, as cpprun says of the other values it ignores.
  const std::optional<std::string> dstate_timeout = env("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT");
  config.uninterruptible_state.timeout_s = resolve_uninterruptible_state_timeout(dstate_timeout);
  if (std::string note = uninterruptible_state_timeout_note(dstate_timeout); !note.empty()) {
    conf_notes.push_back(std::move(note));
  }
  // Note [Opting out of the agent's store]
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is read by torchrun's c10d handler alone
  // (dynamic_rendezvous.py: use_agent_store, next_rendezvous): its workers get
  // TORCHELASTIC_USE_AGENT_STORE=False, MASTER_ADDR the rank-0 node's address (its --local_addr, else
  // its FQDN) and MASTER_PORT a free port there (RendezvousStoreInfo.build: get_free_port()), where
  // worker rank 0 hosts the store itself. torchrun's static backend ignores it. cpprun does the same
  // for the c10d jobs of one node: those torchrun runs with c10d without an endpoint (picked_port: no
  // --master_port, --standalone, c10d's port 0), with the loopback as MASTER_ADDR, and those with an
  // --rdzv_endpoint and --nnodes=1 or 1:1, whose agent hosts the rendezvous there and gives its
  // workers its --local_addr, else the endpoint's host (an address of this machine: it listens
  // there), as for --no_job_secret. A c10d job of several nodes keeps the agents' store, said in a
  // note: the other nodes' workers would have to reach worker rank 0's store, which accepts anyone,
  // directly, where cpprun's authenticated link carries them now.
  if (env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE").value_or("0") == "1") {
    if (config.picked_port || (config.rdzv_backend == RendezvousBackend::kC10d && config.max_nodes == 1)) {
      config.agent_store = false;
    } else if (config.rdzv_backend == RendezvousBackend::kC10d) {
      conf_notes.push_back("cpprun: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is honoured for a c10d job of one node only "
                           "(--nnodes=1 or 1:1); this one (--nnodes=" + std::to_string(config.min_nodes) + ":" +
                           std::to_string(config.max_nodes) + ") keeps the agents' store "
                           "(TORCHELASTIC_USE_AGENT_STORE=True), which the other nodes' workers reach through "
                           "cpprun's authenticated link, not at worker rank 0's unauthenticated store");
    }
  }
  result.notes = ignored_option_notes(raw);
  for (std::string& line : conf_notes) result.notes.push_back(std::move(line));
  for (std::string& line : signal_list_notes(raw.signals_to_handle)) result.notes.push_back(std::move(line));
  take_program(app.remaining(), known, config);
  config.program_mode = program_mode(raw);
  JobSecretOptions secret;
  secret.multi_node = is_multi_node(config);
  secret.secret_file = raw.job_secret_file;
  secret.no_job_secret = config.no_job_secret;
  secret.max_nodes = config.max_nodes;
  secret.endpoint_host = config.master_addr;
  secret.port = config.master_port;
  secret.rdzv_id = config.run_id;
  const std::optional<std::string> given = env(kJobSecretVariable);
  if (job_secret_source(secret, given && !given->empty()) == JobSecretSource::kHostShared) {
    if (config.dry_run) {  // it starts nothing, so it writes no secret either
      config.job_secret = random_nonce() + random_nonce();
      return result;
    }
    config.job_secret_note = "cpprun: no CPPRUN_JOB_SECRET: this job's agents on this host share this user's secret in " +
                             host_secret_path(host_secret_folder(env), secret.port, secret.rdzv_id) +
                             ", which only this user can read";
  }
  config.job_secret = resolve_job_secret(secret, env);
  return result;
}

}  // namespace cpprun::launcher
