// Where a run keeps its per-worker files. Under --log_dir, torchrun's layout: each run makes its own
// LOG_DIR/RUN_ID_XXXXXXXX/ (8 random characters, as Python's mkdtemp), whose attempt_N/LOCAL_RANK/ holds
// stdout.log, stderr.log (--redirects/--tee) and error.json (TORCHELASTIC_ERROR_FILE). --redirects or
// --tee without --log_dir: LOG_DIR is a fresh TEMP/torchelastic_XXXXXX that stays, as torchrun's (TEMP:
// temp_root()).
// Otherwise only error files, as DIR/attempt_N.LOCAL_RANK.error.json in a temp dir cpprun removes.
// A cpprun-XXXXXX temp dir holds a record of its owner, so that the next cpprun removes it if its
// owner was SIGKILLed (stale_run_dirs.h).
// Note [Flat temp dir]: a directory made and removed costs ~0.1 ms on ext4, a launch a few ms.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

// The temp dir, Python's tempfile.gettempdir(), which torchrun's temp dirs come from: the first of
// $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp and the working directory that is a directory this
// process may write in. A TMPDIR that does not exist or is a file is passed over, as Python passes
// it over; cpprun once refused to start there, where torchrun ran. A relative one is made absolute
// (and normalised), as Python's os.path.abspath makes it.
std::string temp_root();

// The paths of a run's files. Pure.
struct RunLayout {
  std::string dir;              // LOG_DIR/RUN_ID_XXXXXXXX, or the flat temp dir
  bool per_worker_dirs = true;  // torchrun's layout (--log_dir); false: flat (the temp dir)
  // cpprun's own files, which torchrun's --log_dir tree does not have: the flat temp dir, or beside a
  // log dir a TEMP/cpprun-XXXXXX of its own (made for --run_path only; "" otherwise),
  // removed at the end either way.
  std::string private_dir;
  // false under --log_dir=/dev/null: the workers get TORCHELASTIC_ERROR_FILE="", as torchrun's
  // DefaultLogsSpecs sets it, and error_file() is "".
  bool error_files = true;
  // The launcher's working directory when the run started, if `dir` is relative (a relative --log_dir);
  // "" when it is absolute. The dump directories are made absolute with it, so that a worker that changes
  // directory (Hydra's chdir) still dumps where the diagnosis looks; the error file stays relative, as
  // torchrun gives it (its mkdtemp keeps a relative --log_dir relative).
  std::string start_dir;

  // What RunDirectory lays out, creating nothing (--dry_run): the random parts stay X's. A `log_dir`
  // of /dev/null (kNullLogDir) is the flat temp dir without error files. `start_dir` is the working
  // directory now when `log_dir` is relative.
  static RunLayout planned(const std::string& log_dir, const std::string& run_id, bool writes_files);

  std::string worker_dir(int attempt, int local_rank) const;  // DIR/attempt_N/LOCAL_RANK
  std::string error_file(int attempt, int local_rank) const;
  // Where the attempt's workers write their flight-recorder dumps (CPPRUN_FLIGHT_RECORDER_DIR):
  // DIR/attempt_N/flight_recorder, or DIR/attempt_N.flight_recorder in the flat temp dir; absolute
  // (start_dir/DIR/... for a relative DIR).
  std::string flight_recorder_dir(int attempt) const;
  // Where PyTorch's NCCL flight recorder dumps (workers/nccl_trace_env.h): DIR/attempt_N/nccl_flight_recorder,
  // or DIR/attempt_N.nccl_flight_recorder in the flat temp dir; absolute as flight_recorder_dir().
  std::string nccl_trace_dir(int attempt) const;
  // Where --run_path workers count themselves finished (command_line/program_command.h):
  // PRIVATE_DIR/attempt_N.run_path_finished, never in the --log_dir tree. The last worker removes it.
  std::string run_path_finished_file(int attempt) const;
  // Where the launcher writes its diagnosis of the attempt (DIR/attempt_N/diagnosis.json); "" in the
  // flat temp dir, which is removed: the console has it.
  std::string diagnosis_file(int attempt) const;

 private:
  // DIR/attempt_N/NAME, or DIR/attempt_N.NAME in the flat temp dir, under start_dir.
  std::string absolute_attempt_file(int attempt, const std::string& name) const;
};

class RunDirectory {
 public:
  // Creates `log_dir` (mkdir -p) or, if empty and `writes_files`, a torchelastic_ temp dir; then the run's
  // RUN_ID_XXXXXXXX in it. Else TEMP/cpprun-XXXXXX. Beside a log dir, the private dir
  // (RunLayout::private_dir) only when `private_files` (--run_path's barrier); else it is "".
  // std::system_error names the path.
  RunDirectory(const std::string& log_dir, const std::string& run_id, bool writes_files, bool private_files = false);
  // Removes the flat temp dir and everything in it, but for PyTorch's NCCL flight-recorder dumps: a
  // nccl_flight_recorder dir that holds any stays, with the temp dir around it (the diagnosis named them).
  // A log dir (given or made) stays; the private dir beside it does not.
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const RunLayout& layout() const { return layout_; }
  // The torchelastic_XXXXXX dir made for --redirects/--tee without --log_dir; "" otherwise.
  const std::string& made_log_dir() const { return made_log_dir_; }
  // The temp dirs of SIGKILLed cpprun runs removed before this one's was made (Note [Stale temp
  // dirs] in stale_run_dirs.cpp): each cpprun-XXXXXX of the temp root records its owner.
  const std::vector<std::string>& removed_stale() const { return removed_stale_; }

  // Under --log_dir: creates attempt_N/0 .. attempt_N/nproc-1. Removes the attempt's stale error files
  // and flight-recorder dumps, cpprun's and PyTorch's NCCL ones (an earlier run's, or c10d's earlier
  // round's: the same attempt number).
  // Creates the attempt's `filtered_logs` (OutputOptions::filtered_logs()) empty, as torchrun opens
  // them whether a stream is --tee'd or not. Throws std::system_error.
  void prepare_attempt(int attempt, int nproc_per_node, const std::vector<std::string>& filtered_logs = {}) const;

 private:
  RunLayout layout_;
  std::string made_log_dir_;
  std::vector<std::string> removed_stale_;
};

// Up to `limit` bytes of the file; nullopt if it does not exist or is not a regular file (a
// worker wrote it: a FIFO there must not block the launcher). A longer file gets a marker.
std::optional<std::string> read_file_head(const std::string& path, std::size_t limit);

}  // namespace cpprun::launcher
