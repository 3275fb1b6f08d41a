// torchrun's hand-over of the root cause's error file: when the job fails, the failing worker's
// TORCHELASTIC_ERROR_FILE is copied into the launcher's own TORCHELASTIC_ERROR_FILE (schedulers read
// it), with "errorCode" set to the worker's exit code, as torch's ErrorHandler.dump_error_file does.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

// `json` with message.errorCode set to `error_code` (torch's exit code: -SIGNAL for a signal), when
// `json` is an object whose "message" is an object; otherwise `json` unchanged (torch only warns).
// 0 leaves it unchanged too. Pure.
std::string with_error_code(const std::string& json, int error_code);

// Copies `worker_error_file` into `launcher_error_file` (replacing it) as above. Nothing when either
// path is empty or the worker wrote no file; a worker's file that is not JSON is not copied: the
// launcher's own error (launcher_error_json) says so instead. Returns a warning to print if the copy
// failed, else "".
std::string copy_root_error_file(const std::string& worker_error_file, const std::string& launcher_error_file,
                                 int error_code);

// The "cpprun_failed_at_ms" that cpprun::record writes in message.extraInfo (Unix milliseconds);
// nullopt where `json` lacks it (torch's @record, another writer) or is not that layout. Pure.
std::optional<long long> recorded_failure_ms(const std::string& json);

// Note [The root cause by report time]
// Of the workers that failed, the root cause is `first_exited` unless it and another recorded when
// they failed (`failed_at_ms`, indexed like the workers; nullopt for a worker that did not fail or
// recorded nothing) and another recorded an earlier time: then the one that recorded first. A rank
// that fails alone ends the others' collectives as its process ends, and it ends last more often
// than not (cpprun::record dumps its flight recorder before it exits): by exit order the victim
// would be named. Ties keep `first_exited`. Pure.
std::size_t root_cause_by_report_time(std::size_t first_exited, const std::vector<std::optional<long long>>& failed_at_ms);

// Note [The launcher's own failure in its error file]
// torchrun's main runs under torch's @record: when the launcher itself fails (a program that cannot
// run, a rendezvous or store failure), its error lands in its TORCHELASTIC_ERROR_FILE, where a
// scheduler (TorchX) reads why the job ended. cpprun writes the same layout, torch's
// ErrorHandler.record_exception's: {"message": {"message": TEXT, "extraInfo": {"py_callstack":
// "", "timestamp": "UNIX_SECONDS"}}} (no Python call stack to give). Pure.
std::string launcher_error_json(const std::string& text, long long unix_seconds);
// Writes launcher_error_json(text, now) to $TORCHELASTIC_ERROR_FILE when it is set; a warning on
// stderr when it cannot be written.
void record_launcher_error(const std::string& text);

struct AttemptEnd;

// After the last attempt failed: copy_root_error_file() of its root cause into $TORCHELASTIC_ERROR_FILE,
// printing the warning if any. An unhealthy attempt (a worker stuck in D state, no worker's error
// file) is recorded as the launcher's own failure (record_launcher_error), with the stuck worker named.
void hand_over_error_file(const AttemptEnd& attempt);

}  // namespace cpprun::launcher
