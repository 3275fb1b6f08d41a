// How the launcher writes values into what it prints: durations as the options take them, and words
// quoted so a printed command can be pasted into a shell. Shared by the workers' dry run, the
// diagnosis and the restart messages, so each is written one way.
#pragma once

#include <chrono>
#include <string>

namespace cpprun::launcher {

// "2", "0.25": a duration as the duration options take it; the launcher's messages add " s".
std::string decimal_seconds(std::chrono::milliseconds ms);

// `word` quoted for a POSIX shell when it needs it, so the printed commands can be pasted.
std::string shell_quote(const std::string& word);

// `text` with its control characters (newlines, escapes, DEL) as '?': what a worker or a peer wrote
// that the launcher prints cannot forge lines or drive the terminal.
std::string printable(std::string text);

}  // namespace cpprun::launcher
