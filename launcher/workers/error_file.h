// torchrun's hand-over of the root cause's error file: when the job fails, the failing worker's
// TORCHELASTIC_ERROR_FILE is copied into the launcher's own TORCHELASTIC_ERROR_FILE (schedulers read
// it), with "errorCode" set to the worker's exit code, as torch's ErrorHandler.dump_error_file does.
#pragma once

#include <string>

namespace cpprun::launcher {

// `json` with message.errorCode set to `error_code` (torch's exit code: -SIGNAL for a signal), when
// `json` is an object whose "message" is an object; otherwise `json` unchanged (torch only warns).
// 0 leaves it unchanged too. Pure.
std::string with_error_code(const std::string& json, int error_code);

// Copies `worker_error_file` into `launcher_error_file` (replacing it) as above. Nothing when either
// path is empty or the worker wrote no file. Returns a warning to print if the copy failed, else "".
std::string copy_root_error_file(const std::string& worker_error_file, const std::string& launcher_error_file,
                                 int error_code);

struct AttemptEnd;

// After the last attempt failed: copy_root_error_file() of its root cause into $TORCHELASTIC_ERROR_FILE,
// printing the warning if any.
void hand_over_error_file(const AttemptEnd& attempt);

}  // namespace cpprun::launcher
