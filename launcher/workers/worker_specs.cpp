// Building each worker's command, environment and output plan, and printing them for --dry_run.
#include "workers/worker_specs.h"

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

std::vector<WorkerSpec> make_worker_specs(const WorkerSettings& settings, const RankLayout& ranks,
                                          const ProgramCommand& program, int restart_count, const RunLayout& files,
                                          const EnvMap& parent_env) {
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < settings.env.local_world_size; ++local_rank) {
    WorkerSpec spec;
    spec.local_rank = local_rank;
    spec.rank = ranks.base_rank + local_rank;
    spec.command.path = program.path;
    spec.command.argv = program.argv;
    spec.error_file = files.error_file(restart_count, local_rank);
    spec.command.env =
        to_env_strings(make_worker_env(settings.env, ranks, local_rank, restart_count, spec.error_file, parent_env));
    // Without --log_dir nothing goes to files (the parser insists), so the flat temp dir is fine.
    spec.output =
        plan_worker_output(settings.output, local_rank, spec.rank, files.worker_dir(restart_count, local_rank));
    specs.push_back(std::move(spec));
  }
  return specs;
}

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
