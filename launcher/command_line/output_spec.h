// Where each worker's stdout and stderr go: torchrun's --redirects, --tee and --local_ranks_filter,
// parsed and resolved per local rank. Pure, so the rules are unit-tested.
#pragma once

#include <string>
#include <vector>

namespace cpprun::launcher {

// torchrun's Std: which of a worker's streams a --redirects or --tee value names.
enum class StdStreams : unsigned { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// "3" (every local rank) or torchrun's map "0:1,1:3" (local ranks left out get 0): a value per local rank.
std::vector<StdStreams> parse_std_spec(const std::string& flag, const std::string& text, int nproc_per_node);

// "0,2": the local ranks whose output reaches the console ("": all of them), a flag per local rank.
std::vector<bool> parse_local_ranks_filter(const std::string& text, int nproc_per_node);

// torchrun's --duplicate_stdout_filters "apple,orange": the needles, ",," standing for a comma.
std::vector<std::string> parse_duplicate_filters(const std::string& text);

// torchrun's DefaultLogsSpecs gives --log_dir os.devnull a meaning of its own: no files at all (no run
// dir, --redirects/--tee and their files dropped, the output on the console) and an empty
// TORCHELASTIC_ERROR_FILE for the workers.
inline constexpr const char* kNullLogDir = "/dev/null";

// The output options of LaunchConfig, validated. Vectors are per local rank; empty ones (a
// default-constructed config) mean "nothing redirected, every rank shown".
struct OutputOptions {
  std::vector<StdStreams> redirects;  // to a file instead of the console
  std::vector<StdStreams> tee;        // to a file and the console
  std::vector<bool> shown;            // --local_ranks_filter
  std::string log_dir;                // empty: unset
  // --duplicate_std{out,err}_filters: a tee'd line holding any of these is also appended to the
  // attempt's filtered_std{out,err}.log, as torchrun's TailLog does.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;

  bool writes_files() const;
  // The attempt's filtered_stdout.log / filtered_stderr.log that --duplicate_std{out,err}_filters ask
  // for: torchrun opens (creates, empties) each whose filters are given, a --tee'd stream or not.
  std::vector<std::string> filtered_logs() const;
};

// One stream of one worker.
struct StreamTarget {
  bool console = true;  // prefixed, line by line
  bool tee = false;     // --tee names it: on the console with WorkerOutputSpec::tee_prefix
  std::string file;     // verbatim; empty: none
  // A tee'd stream's lines holding one of `filters` are appended, prefixed, to `filtered_file`
  // (DIR/attempt_N/filtered_stdout.log), which the workers of the attempt share.
  std::string filtered_file;
  std::vector<std::string> filters;
};

struct WorkerOutputSpec {
  std::string prefix;      // "[rank3]: ", before every console line of a stream not tee'd
  // Before a tee'd stream's console lines: torchrun's TailLog's "[default3]:" (role, local rank),
  // so that what reads torchrun's --tee output reads cpprun's. Either is
  // --log_line_prefix_template's when one is given.
  std::string tee_prefix;
  // A line the worker starts with this gets no `prefix`: torch.distributed's excepthook writes
  // "[rankN]: " before each line of a traceback, which is `prefix` itself (cpprun's default). Empty
  // under --log_line_prefix_template, whose prefix a worker's line may start with by chance; never
  // applied to a tee'd stream, which carries torchrun's prefix on every line as torchrun does.
  std::string worker_own_prefix;
  StreamTarget out;
  StreamTarget err;
};

// What ${role_name}, ${rank}, ${local_rank} and ${hostname} stand for in --log_line_prefix_template.
struct PrefixFields {
  std::string role_name;
  int rank = 0;
  int local_rank = 0;
  std::string hostname;
};

// torchrun's --log_line_prefix_template rendered as Python's string.Template.safe_substitute does:
// $name or ${name} replaced, $$ is $, anything else (an unknown name, a lone $) left as written.
std::string render_prefix_template(const std::string& text, const PrefixFields& fields);

// `worker_dir` is DIR/attempt_N/LOCAL_RANK; its stdout.log and stderr.log are the files.
WorkerOutputSpec plan_worker_output(const OutputOptions& options, const std::string& role, int local_rank, int rank,
                                    const std::string& worker_dir);

}  // namespace cpprun::launcher
