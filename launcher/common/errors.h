// The launcher's error for a bad command line or a bad value from the environment, and its exit
// code. Here, not in command_line/, because every layer that checks what the user gave throws it
// (the job secret, the rendezvous's settings), and none of them may include the command line's parser.
#pragma once

#include <stdexcept>

namespace cpprun::launcher {

// A mistake on the command line; the message names the flag, its value and the fix.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// argparse's (and so torchrun's) code for a bad command line.
inline constexpr int kUsageExitCode = 2;

}  // namespace cpprun::launcher
