// A process group: the ranks of a job, joined through a c10d store, with a Gloo group for CPU
// tensors and (in CUDA builds) an NCCL group for CUDA tensors. Built on LibTorch's c10d.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpprun/env.h"

namespace cpprun {
namespace detail {
struct GroupAccess;  // comm/group_impl.h: the library's way to a group's internals
}  // namespace detail

enum class Backend {
  kAuto,  // NCCL for CUDA tensors when LibTorch has NCCL and every rank has its own GPU; else Gloo
  kGloo,
  kNccl,
};
const char* to_string(Backend backend);

struct ProcessGroupOptions {
  Backend backend = Backend::kAuto;
  // Bounds joining the group and every collective, as torch.distributed's `timeout`. Unset, as
  // PyTorch's default: 10 minutes with kNccl (its default_pg_nccl_timeout), 30 with kAuto and kGloo
  // (default_pg_timeout, which PyTorch's own default backend, cpu:gloo,cuda:nccl, takes too).
  std::optional<std::chrono::milliseconds> timeout;  // unset: default_timeout(backend)
  // Who we are; read from the environment (see env.h) when not given.
  std::optional<DistEnv> env;
  // DETAIL checks every collective across ranks before it runs; TORCH_DISTRIBUTED_DEBUG when
  // not given (see env.h).
  std::optional<DebugLevel> debug_level;
};

// PyTorch's default timeout for a backend (torch.distributed's _get_default_timeout): 10 minutes
// for NCCL, 30 for the others.
std::chrono::milliseconds default_timeout(Backend backend);

// A cheap, copyable handle; the group lives until its last handle is gone.
class ProcessGroup {
 public:
  int rank() const;
  int size() const;
  Backend backend() const;  // what kAuto resolved to: kGloo or kNccl
  const DistEnv& env() const;
  std::chrono::milliseconds timeout() const;
  // False on the ranks that took part in creating a subgroup without joining it: rank() and
  // size() are then -1 (as PyTorch's get_rank and get_world_size of such a group), and
  // collectives, DDP, FSDP, the sampler and the parallel layers refuse the group.
  bool is_member() const;

 private:
  struct Impl;  // comm/group_impl.h
  friend struct detail::GroupAccess;
  explicit ProcessGroup(std::shared_ptr<Impl> impl);

  std::shared_ptr<Impl> impl_;
};

// Joins the job described by options.env (or the environment) and makes the group the default
// one. Collective: every rank must call it. Throws c10::Error with a clear message on bad
// environment values, a taken MASTER_PORT, or ranks that do not arrive within the timeout; and,
// as PyTorch, when the default group exists already (destroy_process_group() first).
ProcessGroup init_process_group(const ProcessGroupOptions& options = {});

bool is_initialized();
ProcessGroup default_group();      // throws unless init_process_group() ran
void destroy_process_group();      // drops the default group (its resources go with the last handle)
// The ranks of `group` as ranks of the job, in the group's rank order (as
// torch.distributed.get_process_group_ranks). Empty on a rank that is not a member.
std::vector<int> get_process_group_ranks(const ProcessGroup& group);

// ---- subgroups (comm/subgroups.cpp) ----
// Note [Subgroup creation]: both are collective over `parent`: every rank of it calls them, in
// the same order, with the same arguments (new_group) — a rank that disagrees, or creates
// groups in another order, gets an error naming every rank's call on every rank. Each subgroup
// has its own store prefix and backends; collectives on disjoint subgroups may run at once. A
// subgroup is a ProcessGroup like any other: collectives, DDP, FSDP and the sampler take it.

// The group of `ranks` (ranks of `parent`, any order: a member's rank in the subgroup is its
// position in the sorted list). Non-members get a handle with is_member() false.
ProcessGroup new_group(const ProcessGroup& parent, std::vector<int> ranks);
ProcessGroup new_group(std::vector<int> ranks);  // parent: default_group()

// Ranks passing the same `colour` form one group, ordered by (key, rank in parent); a rank
// passing kNoColour joins none (as MPI_Comm_split). Returns this rank's group.
constexpr int kNoColour = -1;
ProcessGroup split_group(const ProcessGroup& parent, int colour, int key = 0);

// This process's place in the job: from the default group when initialized, else the environment.
int rank();
int world_size();
int local_rank();
// cuda:LOCAL_RANK when this LibTorch has CUDA and every rank of the job has a GPU of its own (the
// vote Backend::kAuto follows; before init, this node's count decides), else cpu: never a mix.
c10::Device local_device();

}  // namespace cpprun
