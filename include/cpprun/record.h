// cpprun::record: a worker's main that ends with a report, never an abort.
//
//   int main(int argc, char** argv) {
//     return cpprun::record([&] { ...; return 0; });
//   }
//
// An exception escaping main calls std::terminate: SIGABRT, and the launcher can only say that
// the worker was killed by a signal. record() catches it and, as torch.distributed.elastic's
// @record does for Python, writes the file named by TORCHELASTIC_ERROR_FILE (set by cpprun and
// torchrun for each worker), which the launcher shows in its failure summary: the exception's C++
// type and message, the rank and the time. It also prints the error on stderr and returns 1.
#pragma once

#include <exception>
#include <type_traits>
#include <utility>

namespace cpprun {

// What record() returns when `main` threw.
inline constexpr int kRecordedErrorExitCode = 1;

// Reports `error` as record() does (error file, stderr) and returns kRecordedErrorExitCode.
int report_exception(std::exception_ptr error) noexcept;

// Runs `main` (returning int or void) and returns its exit code (0 for void); if it throws,
// reports the exception and returns kRecordedErrorExitCode.
template <class Main>
int record(Main&& main) noexcept {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Main&>>) {
      main();
      return 0;
    } else {
      return static_cast<int>(main());
    }
  } catch (...) {
    return report_exception(std::current_exception());
  }
}

}  // namespace cpprun
