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

AsyncSavePart optimizer_part(OptimizerStateToSave saved, const std::string& path, bool owned) {
  AsyncSavePart part;
  part.state = std::move(saved.state);
  part.path = path;
  part.stem = kOptimizerStem;
  part.metadata = std::move(saved.metadata);
  part.owned = owned;
  return part;
}

}  // namespace cpprun::detail
