// The ranks that save or load one checkpoint together, and who among them does what. A model's
// state is replicated over a data-parallel group (DDP's group, FSDP's whole group: after the
// gathers every rank holds the same whole tensors) and may also be split over tensor-parallel
// groups; no single group reaches every rank of a {dp, tp} layout, so the team keeps both kinds
// and composes them: the writers are the ranks first in every tensor-parallel group (one whole
// data-parallel group of them), and agreement or a broadcast runs over the data-parallel group,
// then over each tensor-parallel group. See Note [Teams over a {dp, tp} mesh] in the .cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun::detail {

class CheckpointTeam {
 public:
  // This process alone: it writes and reads everything; no collective.
  CheckpointTeam() = default;
  // `replicas`: the data-parallel group (none: a plain module, replicated nowhere else);
  // `tensor_parallel`: the distinct tensor-parallel groups this rank belongs to (empty without
  // tensor parallelism), in the same order on every rank.
  explicit CheckpointTeam(std::optional<ProcessGroup> replicas, std::vector<ProcessGroup> tensor_parallel = {});

  // This team, also replicated over `tensor_parallel` (a pipeline stage held whole by each rank
  // of its tensor-parallel group); a group it has already (the same ranks) is not added twice.
  CheckpointTeam also_over(const ProcessGroup& tensor_parallel) const;

  bool alone() const { return !replicas_ && tensor_parallel_.empty(); }
  // Whether this rank writes files: it is first in every tensor-parallel group.
  bool writes() const { return writes_; }
  // Among the writers: this rank's index and their number (a directory's shares).
  int writer_rank() const;
  int writers() const;
  // The one rank that writes a single file or an index and reads what is then broadcast.
  bool is_root() const { return writes_ && writer_rank() == 0; }
  const ProcessGroup* replicas() const { return replicas_ ? &*replicas_ : nullptr; }
  const std::vector<ProcessGroup>& tensor_parallel() const { return tensor_parallel_; }

  // Collective (a barrier too): every rank learns whether any failed. Rethrows this rank's own
  // error; the others throw a FailedElsewhereError (core/failure_agreement.h) naming `what`.
  void agree(std::exception_ptr local, const std::string& what) const;
  // Collective: as agree, but every rank throws the failing rank's own error (share_failure's,
  // core/failure_agreement.h: its kind and message), over the data-parallel group, then each
  // tensor-parallel group. For a pipeline's stages, whose pipeline group agreed first: its
  // verdict then reaches the other pipelines (Note [Agreement across pipelines] in
  // pipeline/stage_checkpoint.cpp).
  void share_failure(std::exception_ptr local, const std::string& what) const;
  // Every group of the team, in agree's order: the data-parallel group, then the tensor-parallel ones.
  std::vector<const ProcessGroup*> groups() const;
  // The root's error (null: none; ignored elsewhere) thrown on every rank, of its kind, as
  // share_root_failure does for one group.
  void share_root_failure(std::exception_ptr root_failure) const;
  // The root's bytes / tensors on every rank.
  void broadcast_bytes(std::string& bytes) const;
  void broadcast_tensors(const std::vector<at::Tensor>& tensors) const;
  // Writer `writer`'s tensors (of the same shapes and dtypes on every rank) on every rank: over
  // the data-parallel group from that writer, then over each tensor-parallel group from its first
  // rank.
  void broadcast_from_writer(const std::vector<at::Tensor>& tensors, int writer) const;
  // Every writer's bytes, in writer order, on every rank (alone: {bytes}); what a rank that
  // writes nothing passes is not kept.
  std::vector<std::string> gather_from_writers(const std::string& bytes) const;

 private:
  std::optional<ProcessGroup> replicas_;
  std::vector<ProcessGroup> tensor_parallel_;
  bool writes_ = true;
};

// Strings as one string that keeps their boundaries (each as its length, ':', its bytes), and
// back: for a list sent with one broadcast_bytes. `what` names the list in the error of one that
// arrived garbled.
std::string pack_strings(const std::vector<std::string>& items);
std::vector<std::string> unpack_strings(const std::string& packed, const char* what);

}  // namespace cpprun::detail
