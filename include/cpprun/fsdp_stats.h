// What FullyShardedDataParallel holds and does, per rank: model->memory() and
// model->prefetch_stats(). For memory accounting against the ZeRO formulas and for tuning
// gathered_unit_limit and prefetch (see FsdpOptions).
#pragma once

#include <cstdint>

namespace cpprun {

// Bytes this rank holds now in each kind of training state.
struct FsdpMemory {
  // Full (unsharded) parameters the wrapped module computes with: the whole model at stages 1
  // and 2; at stage 3 the units gathered right now (0 between steps, unless unshard(),
  // set_reshard_after_backward(false) or set_reshard_after_forward(false) keep some), except alone
  // in the shard group without mixed precision or offload, where there is nothing to shard: the
  // whole model.
  int64_t parameters = 0;
  // The shards the optimizer updates, where they are not part of `parameters` (stage 3 but alone,
  // mixed precision's float32 master copy, CPU offload).
  int64_t shards = 0;
  // Gradients held between a backward and the next one: full ones at stage 1, this rank's shard
  // at stages 2 and 3 (plus a unit's full gradients while their reduction is in flight), and the
  // shards' own where they are copies (mixed precision, offload) or kept from the last step
  // without zero_grad (a copy of this rank's rows at stage 1, the last chunk at stages 2 and 3).
  int64_t gradients = 0;
  // The most `parameters` (plus, at stage 3, the released parameter memory kept for reuse) has
  // been since construction. All-gathers write straight into the parameters; besides them,
  // only two chunks of 1/world of a unit each exist while one runs.
  int64_t peak_parameters = 0;
  // The same for `gradients` (a unit's full gradients live during backward).
  int64_t peak_gradients = 0;
  // Stage 3: released full parameters kept for reuse by the next gather (fresh memory costs a
  // page fault per 4 KiB on the CPU).
  int64_t kept = 0;
};

// Stage 3, since construction: all-gathers started ahead of use (prefetch), and how many of the
// units so gathered were then used before being released. Always zero at stages 1 and 2, and alone in
// the shard group (nothing is gathered).
struct FsdpPrefetchStats {
  int64_t started = 0;
  int64_t used = 0;
};

}  // namespace cpprun
