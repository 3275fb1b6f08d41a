// A module built with deferred initialisation (cpprun/deferred_init.h) under FSDP: each unit is
// materialised just before it is sharded, so that a rank never holds more than its shards plus
// the unit at hand. Every rank replays every unit's records (the generators advance as they do in
// eager construction), then takes rank 0's values, as the eager path does with its broadcast.
#pragma once

#include <torch/nn/module.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "core/deferred_replay.h"
#include "cpprun/process_group.h"
#include "fsdp/unit_plan.h"

namespace cpprun::detail {

// Whether any parameter or buffer of `module` is still deferred.
bool has_deferred_state(torch::nn::Module& module);

class DeferredUnits {
 public:
  DeferredUnits(torch::nn::Module& module, const std::vector<UnitPlan>& units, ProcessGroup group);
  // Buffers and parameters outside the units (those that do not require grad): materialised and
  // broadcast now.
  void materialize_rest();
  // Unit u's parameters: materialised and broadcast (call in unit order, after materialize_rest).
  void materialize_unit(std::size_t u);

 private:
  ProcessGroup group_;
  std::vector<at::Tensor> rest_;
  std::vector<std::vector<at::Tensor>> units_;
  std::unique_ptr<DeferredReplay> replay_;
};

}  // namespace cpprun::detail
