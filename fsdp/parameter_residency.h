// ZeRO-3 scheduling: which units are gathered (their parameters' unsharded memory exists) right
// now. A unit is all-gathered from the shards (one all-gather per bucket, i.e. per dtype) when an
// operator is about to use it (gather_on_use.h tells us), the next unit in forward order (or the
// previous one, in backward) is gathered ahead while it computes, at most `limit` units are
// gathered at once (the least recently used one is released first), all are released after
// forward (except the root unit and the one forward used last, both needed first thing in
// backward; with reshard_after_forward off, none) and each as soon as backward has produced all
// its gradients (with reshard_after_backward off, none). A unit stays gathered until released or
// stale, and a forward uses what is gathered and current (Note [Stale gathered units]).
// Scheduling only: the wire work is fsdp_collectives.h's, the memory handling ParamBucket's.
//
// A gather writes straight into the parameters' memory (fsdp_collectives.h): besides the units
// gathered, only two chunks (1/W of a unit each) of staging exist while it runs.
// In forward, released memory is kept for the next gather of a bucket of the same size, as long
// as gathered plus kept ones stay within `limit`: CPU memory freshly mapped from the OS costs a
// page fault per 4 KiB on first touch (17% of a ZeRO-3 step at 25M parameters, measured), which
// a caching allocator avoids on GPUs. In backward (but for one unit's, for its first gather) it
// goes back to the allocator: each unit's gradients, allocated by autograd as its memory is
// released, need as much, and memory kept here too would put a fifth unit beside the four
// backward needs (two units' parameters, the one computing and the one prefetched, and two
// units' gradients, the one produced and the one being reduced).
//
// Every rank must make the same decisions, because gathers are collectives matched by issue
// order: they depend only on the sequence of operators the model runs, which is the same on
// every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cpprun/collectives.h"
#include "fsdp/gather_on_use.h"
#include "fsdp/param_bucket.h"

namespace cpprun::detail {

struct ResidencyOptions {
  bool reshard_after_forward = true;
  bool reshard_after_backward = true;
  bool prefetch = true;
  int limit = 3;  // units gathered at once
};

class ParameterResidency final : public UseListener {
 public:
  // `root_unit`: the unit holding the root module's own parameters (kept from forward into
  // backward), or none (== unit count).
  ParameterResidency(std::vector<ParamBucket>& buckets, std::size_t unit_count, std::size_t root_unit,
                     ProcessGroup group, ResidencyOptions options);
  ~ParameterResidency() override;
  ParameterResidency(const ParameterResidency&) = delete;
  ParameterResidency& operator=(const ParameterResidency&) = delete;

  void before_use(const std::vector<std::size_t>& units) override;
  // A user's in-place write to a unit's full parameters: refused under mixed precision, else
  // carried to this rank's shards (Note [In-place writes to full parameters] in
  // full_parameter_writes.cpp).
  void before_write(std::size_t unit, const at::Tensor& written, const c10::OperatorName& op) override;
  void after_write(std::size_t unit, const at::Tensor& written) override;

  // A forward starts: units whose shards may have changed since they were gathered are released;
  // the others (kept by unshard(), reshard_after_backward or reshard_after_forward off) are used.
  // `ends_window`: a forward with autograd, which ends the step window (Note [Stale gathered
  // units]); one without (evaluation) gathers anew within the window and leaves it open, as it may
  // come before the optimizer's step.
  void begin_forward(bool ends_window);
  // A later micro-batch's forward in a pipeline step (no optimizer step since the first): units
  // still gathered stay (kept by reshard_after_forward(false)), as torchtitan keeps them under PP.
  void continue_forward();
  // It returned; `backward_follows` when autograd recorded it.
  void end_forward(bool backward_follows);
  // Backward has produced all of this bucket's gradients: its unit goes once all its buckets
  // have (unless reshard_after_backward is off). A unit with frozen parameters (maybe needed after
  // its trainable ones' gradients are in) goes when backward first uses another unit, as room is
  // needed, or at backward's end.
  void backward_done(std::size_t bucket);
  // Backward is over: release everything (unless reshard_after_backward is off). `reduced`: it
  // was synchronized, so the optimizer will step the shards: what is gathered is stale after it.
  void end_backward(bool reduced);
  // A load wrote the shards: what is gathered is stale.
  void shards_replaced();
  // Everything gathered (gather_full_parameters(), unshard()); they stay until a forward's end
  // releases them (reshard_after_forward), a release_all() or a change of their shards.
  void gather_all();
  // Everything released, and the memory kept for reuse freed too (reshard()).
  void release_all();
  void set_reshard_after_forward(bool on);
  void set_reshard_after_backward(bool on);

  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const;  // gathered plus kept, at most
  int64_t kept_bytes() const;           // released memory kept for reuse
  void prefetch_stats(int64_t& started, int64_t& used) const;  // gathers started ahead of use

 private:
  void start_forward_phase();  // a forward's per-unit state, fresh (mutex_ held)
  enum class Phase { kIdle, kForward, kBackward };
  struct UnitState {
    std::vector<std::size_t> buckets;
    std::size_t trainable_buckets = 0;  // those backward_done() hears of (frozen ones get no gradient)
    bool gathered = false;     // allocated, maybe with gathers still in flight
    std::vector<Work> in_flight;     // the all-gathers filling it
    int64_t shard_version = 0;  // the shards' versions summed when it was gathered
    uint64_t epoch = 0;         // epoch_ when it was gathered
    uint64_t last_use = 0;
    bool used_this_phase = false;
    std::size_t buckets_done = 0;  // backward_done() since the last forward
    bool done = false;
    bool prefetched = false;  // gathered ahead of use, not used yet
  };

  void use(std::size_t u, const std::vector<std::size_t>& needed);
  // The bucket of u whose storage `written` is over, or buckets_.size().
  std::size_t bucket_over(std::size_t u, const at::Tensor& written) const;
  void gather(std::size_t u, const std::vector<std::size_t>& keep);
  void start_gather(std::size_t u);  // all-gathers into freshly allocated memory, asynchronously
  void complete(std::size_t u);       // waits for them
  void release(std::size_t u);
  void make_room(const std::vector<std::size_t>& keep);
  // Backward's first use of unit `next`: the units with frozen parameters whose gradients are all
  // in are released (but `keep`).
  void release_finished_frozen_units(std::size_t next, const std::vector<std::size_t>& keep);
  void prefetch_neighbour(std::size_t u, const std::vector<std::size_t>& keep);
  int64_t shard_version(std::size_t u) const;
  bool stale(std::size_t u) const;  // gathered from shards that have changed since
  void release_stale_units();       // at a forward's start and gather_all(): collective, see the .cpp
  void note_peak();
  std::size_t gathered_count() const;
  int64_t spare_bytes() const;
  c10::DataPtr take_spare(std::size_t bytes);
  void keep_spare(std::size_t bytes, c10::DataPtr memory);

  std::vector<ParamBucket>& buckets_;
  std::size_t root_unit_;
  ProcessGroup group_;
  ResidencyOptions options_;
  std::vector<UnitState> states_;
  Phase phase_ = Phase::kIdle;
  uint64_t clock_ = 0;
  uint64_t epoch_ = 0;         // bumped where gathered units become stale: Note [Stale gathered units]
  bool step_window_ = false;   // a synchronized backward has ended, no forward has begun since
  std::vector<std::size_t> order_;       // units in the order the last complete forward first used them
  std::vector<std::size_t> this_order_;  // being recorded by the current forward
  struct Spare {
    std::size_t bytes;
    c10::DataPtr memory;
  };
  std::vector<Spare> spares_;      // released unsharded memory
  int64_t peak_bytes_ = 0;
  int64_t prefetches_ = 0, prefetches_used_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace cpprun::detail
