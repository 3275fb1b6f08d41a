// Each worker's command, environment (torchrun's LocalElasticAgent._start_workers) and output plan.
#include "workers/worker_specs.h"

#include <unistd.h>  // environ

#include <filesystem>
#include <sstream>

#include "common/job_secret.h"
#include "cpprun/launcher_contract.h"
#include "workers/flight_requests.h"
#include "workers/nccl_trace_env.h"

namespace cpprun::launcher {
namespace {

std::string describe_target(const StreamTarget& target, const std::string& prefix) {
  std::string text;
  if (target.console) text = "console, lines prefixed '" + prefix + "'";
  if (!target.file.empty()) text += (text.empty() ? "" : "; ") + target.file;
  return text.empty() ? "discarded (--local_ranks_filter)" : text;
}

}  // namespace

EnvMap current_environment() {
  EnvMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;  // not NAME=value; execve would pass it, nobody reads it
    env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

bool defaults_omp_threads(int local_world_size, const EnvMap& parent) {
  return local_world_size > 1 && parent.count("OMP_NUM_THREADS") == 0;
}

EnvMap make_worker_env(const WorkerEnvSettings& settings, const RankLayout& layout, int local_rank, int restart_count,
                       const std::string& error_file, const EnvMap& parent) {
  EnvMap env = parent;
  // Only the agents need the job secret; a worker, or anything it runs, could leak it.
  env.erase(kJobSecretVariable);
  env["RANK"] = std::to_string(layout.base_rank + local_rank);
  env["LOCAL_RANK"] = std::to_string(settings.virtual_local_rank ? 0 : local_rank);
  env["WORLD_SIZE"] = std::to_string(layout.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(settings.local_world_size);
  env["GROUP_RANK"] = std::to_string(layout.group_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(layout.group_world_size);
  env["ROLE_RANK"] = std::to_string(layout.role_base_rank + local_rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(layout.role_world_size);
  env["ROLE_NAME"] = settings.role;
  env["MASTER_ADDR"] = layout.master_addr.empty() ? settings.master_addr : layout.master_addr;
  env["MASTER_PORT"] = std::to_string(layout.master_port != 0 ? layout.master_port : settings.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(settings.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = settings.run_id;
  // Per worker and per attempt, so the launcher knows whose it is; torchrun overrides the user's too.
  env[contract::kErrorFileVariable] = error_file;
  // The agent hosting the job's store serves it at MASTER_ADDR:MASTER_PORT through its store keeper, as
  // torchrun's agent hosts its own there: every rank connects as a client, each attempt's keys under
  // /worker/attempt_<TORCHELASTIC_RESTART_COUNT> (Note [Store keeper] in store_keeper_plan.h). Set for
  // every worker whatever cpprun's own environment says, as torchrun does; "False" where worker rank 0
  // hosts it instead (Note [Opting out of the agent's store] in launch_config.cpp).
  env["TORCHELASTIC_USE_AGENT_STORE"] = settings.use_agent_store ? "True" : "False";
  // A tunnelled store's MASTER_ADDR is this node's loopback, whatever node rank 0 is on. The variable is
  // the launcher's: one inherited (a cpprun run by a tunnelled worker) must not mislead an untunnelled job.
  if (layout.store_tunnelled) {
    env[contract::kStoreTunnelVariable] = "1";
  } else {
    env.erase(contract::kStoreTunnelVariable);
  }
  // Async error handling turns a hung collective into a failed worker we can restart. As torchrun's
  // local_elastic_agent.py: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the user set that name; the
  // deprecated NCCL_ASYNC_ERROR_HANDLING is passed on untouched and, LibTorch reading the TORCH_ name
  // first, does not turn it off (LibTorch warns about the old name).
  if (parent.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0) {
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  }
  if (defaults_omp_threads(settings.local_world_size, parent)) env["OMP_NUM_THREADS"] = "1";
  // torchrun's launcher exports it, so its workers inherit it.
  env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = settings.signals_to_handle;
  if (settings.virtual_local_rank) {
    // Worker i sees the i-th visible GPU as device 0 (HIP_VISIBLE_DEVICES wins on ROCm, as in torchrun).
    const auto hip = parent.find("HIP_VISIBLE_DEVICES");
    const bool use_hip = hip != parent.end() && !hip->second.empty();
    const auto cuda = parent.find("CUDA_VISIBLE_DEVICES");
    std::string gpu = std::to_string(local_rank);
    if (use_hip || cuda != parent.end()) {
      std::istringstream list(use_hip ? hip->second : cuda->second);
      for (int i = 0; std::getline(list, gpu, ',') && i < local_rank; ++i) {
      }
      const auto first = gpu.find_first_not_of(" \t");
      gpu = first == std::string::npos ? std::string() : gpu.substr(first, gpu.find_last_not_of(" \t") - first + 1);
    }
    env["CUDA_VISIBLE_DEVICES"] = gpu;
    if (use_hip) env["HIP_VISIBLE_DEVICES"] = gpu;
  }
  return env;
}

EnvMap make_keeper_env(const EnvMap& parent) {
  EnvMap env = parent;
  env.erase(kJobSecretVariable);  // as for the workers; CPPRUN_JOB_TOKEN stays, for the guardian's sweep
  return env;
}

std::vector<std::string> to_env_strings(const EnvMap& env) {
  std::vector<std::string> strings;
  strings.reserve(env.size());
  for (const auto& [name, value] : env) strings.push_back(name + "=" + value);
  return strings;
}

std::string substitute_local_rank(const std::string& arg, int local_rank) {
  // The length of the identifier (Python's [_a-z][_a-z0-9]*, any case, ASCII) that starts at `at`.
  const auto identifier = [&](std::size_t at) {
    const auto letter = [](char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
    std::size_t end = at;
    if (end < arg.size() && letter(arg[end])) {
      ++end;
      while (end < arg.size() && (letter(arg[end]) || (arg[end] >= '0' && arg[end] <= '9'))) ++end;
    }
    return end - at;
  };
  const std::string rank = std::to_string(local_rank);
  std::string out;
  for (std::size_t i = 0; i < arg.size();) {
    if (arg[i] != '$') {
      out += arg[i++];
      continue;
    }
    if (i + 1 < arg.size() && arg[i + 1] == '$') {  // torchrun's escape, kept as it is: the shell's pid
      out += "$$";
      i += 2;
      continue;
    }
    if (const std::size_t named = identifier(i + 1); named > 0) {
      out += arg.compare(i + 1, named, "local_rank") == 0 ? rank : arg.substr(i, named + 1);
      i += named + 1;
      continue;
    }
    if (i + 1 < arg.size() && arg[i + 1] == '{') {
      const std::size_t braced = identifier(i + 2);
      if (braced > 0 && i + 2 + braced < arg.size() && arg[i + 2 + braced] == '}') {
        out += arg.compare(i + 2, braced, "local_rank") == 0 ? rank : arg.substr(i, braced + 3);
        i += braced + 3;
        continue;
      }
    }
    out += '$';  // invalid: kept
    ++i;
  }
  return out;
}

std::vector<WorkerSpec> make_worker_specs(const WorkerSettings& settings, const RankLayout& ranks,
                                          const ProgramCommand& program, int restart_count, const RunLayout& files,
                                          const EnvMap& parent_env) {
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < settings.env.local_world_size; ++local_rank) {
    const int rank = ranks.base_rank + local_rank;
    const std::string error_file = files.error_file(restart_count, local_rank);
    const auto chosen = parent_env.find(contract::kFlightRecorderDirVariable);
    const std::string dumps = chosen != parent_env.end() && !chosen->second.empty()
                                  ? chosen->second
                                  : files.flight_recorder_dir(restart_count);
    EnvMap env = make_worker_env(settings.env, ranks, local_rank, restart_count, error_file, parent_env);
    // cpprun's library records each rank's collectives and dumps them here when asked on the fd
    // (workers/flight_requests.h): the launcher's diagnosis of a failure or a hang reads them. A
    // directory the user chose (in cpprun's environment) is kept, shared by the attempts.
    env[contract::kFlightRecorderDirVariable] = dumps;
    env[contract::kFlightRecorderRequestFdVariable] = std::to_string(kFlightRequestFd);
    // Absolute: the script may change directory before it reaches the barrier (a relative --log_dir).
    if (program.local_exit_barrier) {
      env[kRunPathFinishedVariable] = std::filesystem::absolute(files.run_path_finished_file(restart_count)).string();
    }
    // PyTorch's own NCCL flight recorder dumps next to ours, per attempt, unless the user chose where.
    const std::string nccl_dir = files.nccl_trace_dir(restart_count);
    const auto nccl = nccl_trace_variables(parent_env, nccl_dir);
    for (const auto& [name, value] : nccl) env[name] = value;
    WorkerOutputSpec output =
        plan_worker_output(settings.output, settings.env.role, local_rank, rank, files.worker_dir(restart_count, local_rank));
    if (!settings.log_line_prefix_template.empty()) {
      output.prefix = render_prefix_template(settings.log_line_prefix_template,
                                             {settings.env.role, rank, local_rank, settings.hostname});
      output.tee_prefix = output.prefix;
      output.worker_own_prefix.clear();  // a line may start with the user's prefix by chance
    }
    // Note [torchrun's ${local_rank} in the program's arguments]: not argv[0], what is executed.
    std::vector<std::string> argv = program.argv;
    for (std::size_t a = 1; a < argv.size(); ++a) argv[a] = substitute_local_rank(argv[a], local_rank);
    specs.push_back({local_rank, rank, {program.path, std::move(argv), to_env_strings(env)}, output, error_file, dumps,
                     nccl.empty() ? "" : nccl_dir});
  }
  return specs;
}

WorkerSettings worker_settings(const LaunchConfig& c) {
  return {{c.nproc_per_node, c.role, c.master_addr, c.master_port, c.max_restarts, c.run_id, c.virtual_local_rank,
           c.signals_to_handle, c.agent_store},
          c.output,
          c.log_line_prefix_template,
          c.hostname,
          c.uninterruptible_state};
}

std::string format_dry_run(const std::vector<WorkerSpec>& specs, const EnvMap& parent_env) {
  std::ostringstream out;
  out << "cpprun: dry run: " << specs.size() << " worker" << (specs.size() == 1 ? "" : "s")
      << " would start; nothing was started\n";
  for (const WorkerSpec& spec : specs) {
    out << "rank " << spec.rank << " (local_rank " << spec.local_rank << "):\n  command:";
    for (const std::string& arg : spec.command.argv) out << " " << shell_quote(arg);
    out << "\n  program: " << spec.command.path << "\n";
    const auto prefix_of = [&](const StreamTarget& t) { return t.tee ? spec.output.tee_prefix : spec.output.prefix; };
    out << "  stdout: " << describe_target(spec.output.out, prefix_of(spec.output.out)) << "\n";
    out << "  stderr: " << describe_target(spec.output.err, prefix_of(spec.output.err)) << "\n";
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
