// Reads RANK / WORLD_SIZE / ... (or Slurm's, or Open MPI's) and validates them, so that a wrong
// environment fails at start-up with a message that names the variable, instead of a hang later.
#include "cpprun/env.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

namespace cpprun {
namespace {

// What sets each convention's variables, for the error messages.
const char* setter_of(EnvSource source) {
  switch (source) {
    case EnvSource::kTorchrun: return "set by cpprun or torchrun for each worker";
    case EnvSource::kSlurm: return "set by srun for each task";
    case EnvSource::kOpenMpi: return "set by Open MPI's mpirun for each process";
    case EnvSource::kSingleProcess: return "not set";
  }
  return "";
}

class Reader {
 public:
  Reader(const EnvLookup& lookup, EnvSource source) : lookup_(lookup), source_(source) {}

  std::optional<std::string> get(const std::string& name) const { return lookup_(name); }

  // set_by_launcher false: a variable this source's launcher does not set (srun and mpirun leave
  // MASTER_ADDR to the user), so the message does not say it sets it.
  std::string require(const std::string& name, const char* hint = nullptr, bool set_by_launcher = true) const {
    auto value = lookup_(name);
    TORCH_CHECK(value && !value->empty(), "cpprun: environment variable ", name, " is not set",
                set_by_launcher ? std::string(" (it is ") + setter_of(source_) + "). " : std::string(". "),
                hint ? hint : "Start the program under a launcher, e.g. `cpprun --nproc_per_node=2 PROGRAM`.");
    return *value;
  }

  int require_int(const std::string& name, int min_value) const {
    return parse_int(name, require(name), min_value);
  }

  std::optional<int> optional_int(const std::string& name, int min_value) const {
    auto value = lookup_(name);
    if (!value || value->empty()) return std::nullopt;
    return parse_int(name, *value, min_value);
  }

  int parse_int(const std::string& name, const std::string& text, int min_value) const {
    int result = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, result);
    TORCH_CHECK(ec == std::errc() && ptr == end, "cpprun: ", name, "=\"", text,
                "\" is not a whole number (", name, " is ", setter_of(source_), ").");
    TORCH_CHECK(result >= min_value, "cpprun: ", name, "=", result, " must be at least ", min_value,
                " (", name, " is ", setter_of(source_), ").");
    return result;
  }

 private:
  const EnvLookup& lookup_;
  EnvSource source_;
};

EnvSource detect_source(const EnvLookup& lookup) {
  if (lookup("RANK") || lookup("WORLD_SIZE")) return EnvSource::kTorchrun;
  if (lookup("SLURM_PROCID")) return EnvSource::kSlurm;
  if (lookup("OMPI_COMM_WORLD_RANK")) return EnvSource::kOpenMpi;
  return EnvSource::kSingleProcess;
}

// Slurm's SLURM_TASKS_PER_NODE reads like "4(x2),3": the first node's count is what we need
// only when SLURM_NTASKS_PER_NODE (set with --ntasks-per-node) is absent.
std::optional<int> slurm_local_world_size(const Reader& env) {
  if (auto n = env.optional_int("SLURM_NTASKS_PER_NODE", 1)) return n;
  auto tasks = env.get("SLURM_TASKS_PER_NODE");
  if (!tasks || tasks->empty()) return std::nullopt;
  auto digits_end = tasks->find_first_not_of("0123456789");
  return env.parse_int("SLURM_TASKS_PER_NODE", tasks->substr(0, digits_end), 1);
}

void read_master(const Reader& env, DistEnv& out) {
  const char* hint =
      out.source == EnvSource::kTorchrun
          ? "cpprun and torchrun set MASTER_ADDR and MASTER_PORT; when starting workers by hand, "
            "export MASTER_ADDR=<rank 0's host> MASTER_PORT=<free port> on every rank."
          : "This launcher does not set it: export MASTER_ADDR=<host of rank 0> (under Slurm: "
            "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)) and MASTER_PORT=<free port> "
            "before starting the job.";
  const bool set_by_launcher = out.source == EnvSource::kTorchrun;
  out.master_addr = env.require("MASTER_ADDR", hint, set_by_launcher);
  env.require("MASTER_PORT", hint, set_by_launcher);
  out.master_port = env.require_int("MASTER_PORT", 1);
  TORCH_CHECK(out.master_port <= 65535, "cpprun: MASTER_PORT=", out.master_port,
              " is not a TCP port (1..65535).");
}

}  // namespace

DistEnv read_dist_env(const EnvLookup& lookup) {
  DistEnv out;
  out.source = detect_source(lookup);
  if (out.source == EnvSource::kSingleProcess) return out;  // a world of one needs nothing else

  const Reader env(lookup, out.source);
  std::string rank_var, size_var, local_rank_var;
  switch (out.source) {
    case EnvSource::kTorchrun:
      rank_var = "RANK", size_var = "WORLD_SIZE", local_rank_var = "LOCAL_RANK";
      out.rank = env.require_int(rank_var, 0);
      out.world_size = env.require_int(size_var, 1);
      // Hand-started workers often set only RANK/WORLD_SIZE: then assume one node, as
      // torch.distributed's env:// does.
      out.local_rank = env.optional_int("LOCAL_RANK", 0).value_or(out.rank);
      out.local_world_size = env.optional_int("LOCAL_WORLD_SIZE", 1).value_or(out.world_size);
      out.agent_hosts_store = env.get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
      out.restart_count = env.optional_int("TORCHELASTIC_RESTART_COUNT", 0).value_or(0);
      break;
    case EnvSource::kSlurm:
      rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS", local_rank_var = "SLURM_LOCALID";
      out.rank = env.require_int(rank_var, 0);
      out.world_size = env.require_int(size_var, 1);
      out.local_rank = env.require_int(local_rank_var, 0);
      out.local_world_size = slurm_local_world_size(env).value_or(out.local_rank + 1);
      break;
    case EnvSource::kOpenMpi:
      rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE",
      local_rank_var = "OMPI_COMM_WORLD_LOCAL_RANK";
      out.rank = env.require_int(rank_var, 0);
      out.world_size = env.require_int(size_var, 1);
      out.local_rank = env.require_int(local_rank_var, 0);
      out.local_world_size =
          env.optional_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(out.local_rank + 1);
      break;
    case EnvSource::kSingleProcess:
      break;
  }
  TORCH_CHECK(out.rank < out.world_size, "cpprun: ", rank_var, "=", out.rank, " is not below ",
              size_var, "=", out.world_size, "; ranks run from 0 to ", size_var,
              "-1. Check the launcher's world size (", setter_of(out.source), ").");
  TORCH_CHECK(out.local_rank < out.local_world_size, "cpprun: ", local_rank_var, "=",
              out.local_rank, " is not below the local world size ", out.local_world_size,
              " (", setter_of(out.source), ").");
  read_master(env, out);
  return out;
}

DebugLevel read_debug_level(const EnvLookup& lookup) {
  auto value = lookup("TORCH_DISTRIBUTED_DEBUG");
  if (!value) return DebugLevel::kOff;
  std::string level = *value;
  std::transform(level.begin(), level.end(), level.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (level == "OFF") return DebugLevel::kOff;
  if (level == "INFO") return DebugLevel::kInfo;
  if (level == "DETAIL") return DebugLevel::kDetail;
  TORCH_CHECK(false, "cpprun: TORCH_DISTRIBUTED_DEBUG=\"", *value, "\" is not a debug level; it "
              "must be OFF, INFO or DETAIL (as in PyTorch). DETAIL checks every collective across "
              "ranks before it runs; unset it for the default.");
}

const char* to_string(DebugLevel level) {
  switch (level) {
    case DebugLevel::kOff: return "OFF";
    case DebugLevel::kInfo: return "INFO";
    case DebugLevel::kDetail: return "DETAIL";
  }
  return "?";
}

const char* to_string(EnvSource source) {
  switch (source) {
    case EnvSource::kTorchrun: return "torchrun";
    case EnvSource::kSlurm: return "slurm";
    case EnvSource::kOpenMpi: return "openmpi";
    case EnvSource::kSingleProcess: return "single-process";
  }
  return "?";
}

}  // namespace cpprun
