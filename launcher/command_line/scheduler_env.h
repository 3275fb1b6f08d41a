// Multi-node defaults from the job scheduler's environment: cpprun started once per node by srun
// (Slurm), by mpirun --map-by ppr:1:node (Open MPI), or in a Kubeflow PyTorchJob pod. Pure: the
// environment comes in through a lookup, so every rule here is unit-tested with faked ones.
#pragma once

#include <optional>
#include <string>

#include <cpprun/env_lookup.h>  // EnvLookup, process_env(): the library's, LibTorch-free

#include "common/errors.h"  // UsageError

namespace cpprun::launcher {

using cpprun::EnvLookup;  // for the tests, which use namespace cpprun::launcher

// What the scheduler says about this node, with the variables errors name.
struct SchedulerDefaults {
  std::string source;  // "Slurm", "Open MPI", "Kubeflow"
  int nnodes = 1;
  std::string nnodes_var;  // e.g. SLURM_NNODES
  int node_rank = 0;
  std::string node_rank_var;               // e.g. SLURM_NODEID
  std::optional<std::string> master_addr;  // Open MPI: only when MASTER_ADDR is set
  std::optional<int> master_port;          // from MASTER_PORT where the scheduler sets it
};

// A scheduler variable whose value cpprun cannot use; the message names it, the value and the fix.
class SchedulerEnvError : public UsageError {
 public:
  using UsageError::UsageError;
};

// Slurm first (SLURM_JOB_ID), then Open MPI (OMPI_COMM_WORLD_SIZE), then Kubeflow (MASTER_ADDR, MASTER_PORT,
// WORLD_SIZE and RANK set, LOCAL_RANK not); nullopt when none applies. Throws SchedulerEnvError.
std::optional<SchedulerDefaults> derive_from_scheduler(const EnvLookup& env);

// The first host of a Slurm host list in its compressed form: "node[01-03,07],gpu5" -> "node01",
// "rack[1-2]-n[8-9]" -> "rack1-n8". Throws SchedulerEnvError naming `variable` when malformed.
std::string first_slurm_host(const std::string& nodelist, const std::string& variable = "SLURM_JOB_NODELIST");

}  // namespace cpprun::launcher
