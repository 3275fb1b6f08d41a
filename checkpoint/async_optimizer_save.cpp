// See async_optimizer_save.h.
#include "checkpoint/async_optimizer_save.h"

#include <utility>
#include <vector>

#include "checkpoint/async_save.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "core/tensor_parallel_splits.h"
#include "cpprun/optimizer_state_dict.h"

namespace cpprun::detail {

void check_async_save_paths(const std::string& model_path, const std::string& optimizer_path) {
  check_state_dict_path(model_path);
  check_optimizer_path(optimizer_path, "save_async");
  TORCH_CHECK(model_path != optimizer_path || is_sharded_state_dict_path(model_path), "cpprun: save_async(model, "
              "optimizer, \"", model_path, "\", \"", optimizer_path, "\"): the model's and the optimizer's files would "
              "be one file; give each its own path, or one directory (ending in '/') for both.");
}

AsyncSave start_async_save_with_optimizer(NamedTensors model_state, OptimizerStateToSave optimizer_state,
                                          const CheckpointTeam& team, const std::string& model_path,
                                          const std::string& optimizer_path, const StateDictSaveOptions& options) {
  std::vector<AsyncSavePart> parts(2);
  parts[0].state = std::move(model_state);
  parts[0].path = model_path;
  parts[1].state = std::move(optimizer_state.state);
  parts[1].path = optimizer_path;
  parts[1].stem = kOptimizerStem;
  parts[1].metadata = std::move(optimizer_state.metadata);
  return start_async_save(std::move(parts), team, options);
}

}  // namespace cpprun::detail
