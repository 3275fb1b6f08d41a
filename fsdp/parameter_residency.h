// ZeRO-3 scheduling: which flat parameters are gathered (their full memory exists) right now.
// A unit (a wrapped module) has one flat parameter per dtype, so usually exactly one; scheduling
// is per flat parameter. One is all-gathered from the shards when an operator is about to use it
// (gather_on_use.h tells us), the next in forward order (or the previous one, in backward) is
// gathered ahead while it computes, at most `limit` are gathered at once (the least recently used
// one is released first), all are released after forward (except those of the root unit and the
// one forward used last, both needed first thing in backward) and each as soon as backward has
// produced all its gradients. Scheduling only: the collectives are comm/'s, the memory handling
// FlatParam's.
//
// Released memory is kept for the next gather of a flat parameter of the same size, as long as
// gathered plus kept ones stay within `limit`: CPU memory freshly mapped from the OS costs a page fault
// per 4 KiB on first touch (17% of a ZeRO-3 step at 25M parameters, measured), which a caching
// allocator avoids on GPUs.
//
// Every rank must make the same decisions, because gathers are collectives matched by issue
// order: they depend only on the sequence of operators the model runs, which is the same on
// every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cpprun/collectives.h"
#include "fsdp/flat_param.h"
#include "fsdp/gather_on_use.h"

namespace cpprun::detail {

struct ResidencyOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
  int limit = 3;  // gathered flat parameters alive at once
};

class ParameterResidency final : public UseListener {
 public:
  // root[f]: flats_[f] holds parameters of the root module (kept from forward into backward).
  ParameterResidency(std::vector<FlatParam>& flats, std::vector<bool> root, ProcessGroup group,
                     ResidencyOptions options);
  ~ParameterResidency() override;
  ParameterResidency(const ParameterResidency&) = delete;
  ParameterResidency& operator=(const ParameterResidency&) = delete;

  void before_use(const std::vector<std::size_t>& flats) override;

  // A forward starts: everything is released (the shards may have been stepped since).
  void begin_forward();
  // It returned; `backward_follows` when autograd recorded it.
  void end_forward(bool backward_follows);
  // Backward has produced all of this flat parameter's gradients: it is not needed any more.
  void backward_done(std::size_t flat);
  // Backward is over: release everything.
  void end_backward();
  // Everything gathered (checkpoints, gather_full_parameters()); they stay until the next forward.
  void gather_all();
  void release_all();

  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const;  // gathered plus kept, at most
  int64_t kept_bytes() const;  // released memory kept for reuse
  void prefetch_stats(int64_t& started, int64_t& used) const;  // gathers started ahead of use

 private:
  enum class Phase { kIdle, kForward, kBackward };
  struct FlatState {
    bool gathered = false;   // allocated, maybe with a gather still in flight
    Work in_flight;          // the all-gather filling it
    at::Tensor send;         // its input, alive until the gather completes
    int64_t shard_version = 0;
    uint64_t last_use = 0;
    bool used_this_phase = false;
    bool done = false;       // backward_done() since the last forward
    bool prefetched = false; // gathered ahead of use, not used yet
  };

  void use(std::size_t u, const std::vector<std::size_t>& needed);
  void gather(std::size_t u, const std::vector<std::size_t>& keep);
  void start_gather(std::size_t u);  // all-gather into freshly allocated memory, asynchronously
  void complete(std::size_t u);       // wait for it
  void release(std::size_t u);
  void make_room(const std::vector<std::size_t>& keep);
  void prefetch_neighbour(std::size_t u, const std::vector<std::size_t>& keep);
  bool stale(std::size_t u) const;
  std::size_t gathered_count() const;
  int64_t spare_bytes() const;

  std::vector<FlatParam>& flats_;
  std::vector<bool> root_;
  ProcessGroup group_;
  ResidencyOptions options_;
  std::vector<FlatState> states_;
  Phase phase_ = Phase::kIdle;
  uint64_t clock_ = 0;
  std::vector<std::size_t> order_;       // flat parameters in the order the last complete forward first used them
  std::vector<std::size_t> this_order_;  // being recorded by the current forward
  struct Spare {
    std::size_t bytes;
    c10::DataPtr memory;
  };
  std::vector<Spare> spares_;
  int64_t peak_bytes_ = 0;
  int64_t prefetches_ = 0, prefetches_used_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace cpprun::detail
