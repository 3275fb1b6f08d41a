// Deferred initialisation, the replaying half: gives deferred tensors (core/deferred_init.h)
// their memory and values, group by group (FSDP: unit by unit), running their records in
// recording order. Values are eager construction's because every op draws from its generator in
// the state eager construction would have left it in:
//  - when the groups, taken in order, replay the random draws in recording order (the usual case:
//    units follow construction order), each group draws straight from the live generator;
//  - otherwise a first pass runs every random draw in recording order on scratch memory (one
//    tensor at a time) and keeps each draw's generator state (a few KiB), which the groups then
//    start their draws from.
// Either way the generators end where eager construction leaves them. The draws of deferred
// tensors that died before materialisation take part in the first pass (Note [Dropped draws]).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "core/deferred_init.h"

namespace cpprun::detail {

class DeferredReplay {
 public:
  // `groups`: the tensors to materialise together, in the order materialize() will take them. Tensors
  // that are not deferred are left alone; one already in an earlier group (tied) is skipped.
  // every_group: false when only some groups will be materialised (a pipeline stage's part of a
  // model): their draws then start from snapshots, and the generators still end where eager
  // construction of the whole leaves them.
  explicit DeferredReplay(const std::vector<std::vector<at::Tensor>>& groups, bool every_group = true);
  ~DeferredReplay();
  DeferredReplay(const DeferredReplay&) = delete;
  DeferredReplay& operator=(const DeferredReplay&) = delete;

  // Groups must be materialised in order, each once.
  void materialize(std::size_t group);
  bool used_state_snapshots() const { return snapshots_; }

 private:
  struct Entry {
    c10::Storage storage;  // until materialised
    std::size_t nbytes = 0;
    c10::Device device = c10::Device(c10::kCPU);
    DeferredOps ops;  // by seq
    int group = -1;   // -1: only read by other records
  };
  void add_entry(const c10::StorageImpl* key, int group);
  bool needs_snapshots() const;
  void take_snapshots();
  // Runs `op` writing into `target` (a tensor over the written storage, shaped as recorded).
  void run(const DeferredOp& op, const at::Tensor& target, int group);
  // A read input's value just before `seq`: the live storage in the group being replayed, else
  // rebuilt from its records into scratch memory.
  at::Tensor value_of(const DeferredOp::Input& input, uint64_t seq, int group);
  void restore_final_states();

  std::vector<std::vector<const c10::StorageImpl*>> groups_;
  std::vector<std::vector<at::Tensor>> group_tensors_;
  std::unordered_map<const c10::StorageImpl*, Entry> entries_;
  std::size_t next_group_ = 0;
  bool snapshots_ = false;
  std::vector<DroppedDraw> dropped_;  // replayed in the first pass only
  std::unordered_map<const DeferredOp*, at::Tensor> state_before_;
  std::vector<std::pair<at::Generator, at::Tensor>> final_states_;
};

}  // namespace cpprun::detail
