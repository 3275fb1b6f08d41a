// What the library's pipeline code outside PipelineStage and the schedules (checkpoints) reads of
// a stage beyond its public interface: the ties of its split.
#pragma once

#include "cpprun/pipeline.h"
#include "pipeline/tied_parameters.h"

namespace cpprun::detail {

struct StageAccess {
  static const StageTies& ties(const PipelineStage& stage) { return *stage.ties_; }
};

}  // namespace cpprun::detail
