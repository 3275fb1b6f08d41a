// Reads who this process is in a distributed job from the environment that a launcher set:
// cpprun / torchrun (RANK, WORLD_SIZE, ...), Slurm's srun (SLURM_*), or Open MPI's mpirun (OMPI_*).
#pragma once

#include <optional>
#include <string>

#include "cpprun/env_lookup.h"  // EnvLookup, process_env()

namespace cpprun {

// Which launcher's conventions the values were read from.
enum class EnvSource {
  kTorchrun,       // RANK / WORLD_SIZE / LOCAL_RANK / ... (cpprun, torchrun, Kubeflow)
  kSlurm,          // SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
  kOpenMpi,        // OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
  kSingleProcess,  // nothing set: a plain `./train` is a world of one
};

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 only for kSingleProcess, which needs no store server
  EnvSource source = EnvSource::kSingleProcess;
  // torchrun's TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store, so
  // rank 0 must connect to it as a client instead of starting a server.
  bool agent_hosts_store = false;
  // TORCHELASTIC_RESTART_COUNT: which attempt this is. In a launcher's store each attempt's keys go
  // under "/worker/attempt_N", as older torch's env:// put them (a store may outlive restarts).
  int restart_count = 0;
};

// Reads and validates the environment. Throws c10::Error naming the variable, its value,
// what normally sets it and how to fix it (missing, not a number, RANK >= WORLD_SIZE, ...).
DistEnv read_dist_env(const EnvLookup& lookup = process_env());

const char* to_string(EnvSource source);

// TORCH_DISTRIBUTED_DEBUG, read as PyTorch reads it (case-insensitive OFF, INFO or DETAIL; unset
// is OFF). DETAIL makes every collective first check that all ranks called the same one with the
// same shapes, dtypes and roots (docs/process_groups.md, "Collectives"); INFO adds nothing yet.
enum class DebugLevel { kOff, kInfo, kDetail };
DebugLevel read_debug_level(const EnvLookup& lookup = process_env());
const char* to_string(DebugLevel level);

}  // namespace cpprun
