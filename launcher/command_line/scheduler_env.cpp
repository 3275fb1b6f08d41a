// Reads Slurm's, Open MPI's and Kubeflow's variables into --nnodes/--node_rank/--master_addr defaults.
#include "command_line/scheduler_env.h"

#include <cctype>

#include "command_line/launch_config.h"  // with_value, int_in_range, kMaxNodes

namespace cpprun::launcher {
namespace {

// A whole number from min to max, or an error naming the variable, its value and what it should be.
int read_number(const EnvLookup& env, const std::string& variable, long min, long max, const std::string& meaning) {
  const std::string text = env(variable).value_or("");
  if (const std::optional<int> value = int_in_range(text, min, max)) return *value;
  throw SchedulerEnvError(with_value(variable, text) + ": expected " + meaning + ", a whole number from " +
                          std::to_string(min) + " to " + std::to_string(max));
}

// The node count, then a node rank that fits it.
SchedulerDefaults read_nodes(const EnvLookup& env, const std::string& source, const std::string& nnodes_var,
                             const std::string& node_rank_var) {
  const int nnodes = read_number(env, nnodes_var, 1, kMaxNodes, "the number of nodes");
  const int node_rank = read_number(env, node_rank_var, 0, nnodes - 1,
                                    "this node's rank among " + with_value(nnodes_var, std::to_string(nnodes)));
  return {source, nnodes, nnodes_var, node_rank, node_rank_var, std::nullopt, std::nullopt};
}

SchedulerDefaults with_master(const EnvLookup& env, SchedulerDefaults d) {
  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) d.master_addr = *addr;
  if (auto port = env("MASTER_PORT"); port && !port->empty()) {
    d.master_port = read_number(env, "MASTER_PORT", 1, 65535, "a TCP port");
  }
  return d;
}

SchedulerDefaults from_slurm(const EnvLookup& env) {
  SchedulerDefaults d = read_nodes(env, "Slurm", "SLURM_NNODES", "SLURM_NODEID");
  // srun sets the step's task count; cpprun starts a node's workers itself, so one task per node.
  const auto tasks = env("SLURM_STEP_NUM_TASKS");
  if (tasks && *tasks != std::to_string(d.nnodes)) {
    throw SchedulerEnvError(with_value("SLURM_STEP_NUM_TASKS", *tasks) + " with " +
                            with_value("SLURM_NNODES", std::to_string(d.nnodes)) +
                            ": cpprun starts each node's workers itself; run one cpprun per node "
                            "(srun --ntasks-per-node=1 cpprun ...), or pass --nnodes/--node_rank/--master_addr");
  }
  d.master_addr = first_slurm_host(env("SLURM_JOB_NODELIST").value_or(""), "SLURM_JOB_NODELIST");
  return d;
}

SchedulerDefaults from_open_mpi(const EnvLookup& env) {
  if (const auto local = env("OMPI_COMM_WORLD_LOCAL_SIZE"); local && *local != "1") {
    throw SchedulerEnvError(with_value("OMPI_COMM_WORLD_LOCAL_SIZE", *local) +
                            ": cpprun starts each node's workers itself; start one cpprun per node "
                            "(mpirun --map-by ppr:1:node cpprun ...), or pass --nnodes/--node_rank/--master_addr");
  }
  // mpirun knows no master address: MASTER_ADDR or --master_addr must say it.
  return with_master(env, read_nodes(env, "Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"));
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist, const std::string& variable) {
  const auto bad = [&](const std::string& why) {
    return SchedulerEnvError(with_value(variable, nodelist) + ": " + why +
                             " (expected a Slurm host list such as node[01-03,07],gpu5); pass --master_addr=HOST");
  };
  std::string host;
  for (std::size_t i = 0; i < nodelist.size() && nodelist[i] != ','; ++i) {
    if (nodelist[i] == ']') throw bad("']' without '['");
    if (nodelist[i] != '[') {
      host += nodelist[i];
      continue;
    }
    const auto close = nodelist.find(']', i);
    if (close == std::string::npos) throw bad("'[' without ']'");
    // The first number of the first range, zero padding kept: "[007-010,12]" -> "007".
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty()) throw bad("empty range");
    for (char digit : group) {
      if (!std::isdigit(static_cast<unsigned char>(digit)) && digit != ',' && digit != '-') {
        throw bad("'" + group + "' is not a list of numbers and ranges");
      }
    }
    host += first;
    i = close;  // the loop steps past ']'
  }
  if (host.empty()) throw bad(nodelist.empty() ? "not set or empty" : "no host name before the first ','");
  return host;
}

std::optional<SchedulerDefaults> derive_from_scheduler(const EnvLookup& env) {
  const auto is_set = [&](const char* name) { return env(name).has_value(); };
  if (is_set("SLURM_JOB_ID")) return from_slurm(env);
  if (is_set("OMPI_COMM_WORLD_SIZE")) return from_open_mpi(env);
  // Kubeflow's PyTorchJob operator sets WORLD_SIZE to the number of pods and RANK to this pod's index;
  // LOCAL_RANK set means a worker of torchrun or cpprun, whose RANK/WORLD_SIZE count workers, not pods.
  const bool pod = is_set("MASTER_ADDR") && is_set("MASTER_PORT") && is_set("WORLD_SIZE") && is_set("RANK");
  if (pod && !is_set("LOCAL_RANK")) return with_master(env, read_nodes(env, "Kubeflow", "WORLD_SIZE", "RANK"));
  return std::nullopt;
}

}  // namespace cpprun::launcher
