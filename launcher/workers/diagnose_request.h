// `cpprun --diagnose PID`: asks the running cpprun PID where its ranks are (docs/faults_and_trust.md,
// "When a job hangs") and prints its answer. The running cpprun gathers its workers' flight-recorder
// dumps, prints the diagnosis on its own console, and writes it to a file this process passes it.
#pragma once

#include <chrono>
#include <string>

namespace cpprun::launcher {

// `args`: what followed `--diagnose` (one PID; "--diagnose=PID" arrives as {"PID"}). Returns the exit
// code: 0 answered, 1 no answer within `timeout`, 2 bad usage (not a PID, not a cpprun).
int request_diagnosis(const std::string& pid_text, std::chrono::milliseconds timeout);

}  // namespace cpprun::launcher
