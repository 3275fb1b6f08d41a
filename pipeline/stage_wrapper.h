// What the pipeline asks of a stage's data-parallel wrapper (PipelineStage::set_data_parallel):
// its core, through which the schedule finalizes the step's reduction and clipping finds FSDP's
// shard group.
#pragma once

#include "cpprun/pipeline.h"

namespace cpprun::detail {

// The stage's wrapper's core; null when the stage has no wrapper.
inline DataParallelCore* data_parallel_core(const PipelineStage& stage) {
  const auto& wrapper = stage.data_parallel();
  return wrapper.is_empty() ? nullptr : &DataParallelAccess::core(*wrapper.ptr());
}

// The group the stage's gradients are sharded over (FSDP); null when each rank holds them whole.
inline const ProcessGroup* stage_shard_group(const PipelineStage& stage) {
  const DataParallelCore* core = data_parallel_core(stage);
  return core != nullptr ? core->shard_group() : nullptr;
}

}  // namespace cpprun::detail
