// Formatting the dry-run report.
#include "command_line/dry_run.h"

#include <sstream>

namespace cpprun::launcher {
namespace {

std::string describe_target(const StreamTarget& target, const std::string& prefix) {
  std::string text;
  if (target.console) text = "console, lines prefixed '" + prefix + "'";
  if (!target.file.empty()) text += (text.empty() ? "" : "; ") + target.file;
  return text.empty() ? "discarded (--local_ranks_filter)" : text;
}

}  // namespace

std::string shell_quote(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-+=./:,@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string format_dry_run(const std::vector<WorkerSpec>& specs, const EnvMap& parent_env) {
  std::ostringstream out;
  out << "cpprun: dry run: " << specs.size() << " worker" << (specs.size() == 1 ? "" : "s")
      << " would start; nothing was started\n";
  for (const WorkerSpec& spec : specs) {
    out << "rank " << spec.rank << " (local_rank " << spec.local_rank << "):\n  command:";
    for (const std::string& arg : spec.command.argv) out << " " << shell_quote(arg);
    out << "\n  program: " << spec.command.path << "\n";
    out << "  stdout: " << describe_target(spec.output.out, spec.output.prefix) << "\n";
    out << "  stderr: " << describe_target(spec.output.err, spec.output.prefix) << "\n";
    out << "  environment set by cpprun:\n";
    // Only what differs from cpprun's own environment, which the worker inherits as well.
    for (const std::string& entry : spec.command.env) {
      const auto eq = entry.find('=');
      const auto inherited = parent_env.find(entry.substr(0, eq));
      if (inherited != parent_env.end() && inherited->second == entry.substr(eq + 1)) continue;
      out << "    " << entry.substr(0, eq + 1) << shell_quote(entry.substr(eq + 1)) << "\n";
    }
  }
  return out.str();
}

}  // namespace cpprun::launcher
