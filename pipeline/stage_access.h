// What the library's pipeline code outside PipelineStage reads of a stage beyond its public
// interface: the ties of its split (checkpoints), and the split itself (the schedules).
#pragma once

#include "cpprun/pipeline.h"
#include "pipeline/tied_parameters.h"

namespace cpprun::detail {

struct StageAccess {
  static const StageTies& ties(const PipelineStage& stage) { return *stage.ties_; }
  static const std::string& split_text(const PipelineStage& stage) { return stage.split_text_; }
};

}  // namespace cpprun::detail
