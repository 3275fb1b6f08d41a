// See tensor_parallel_state.h.
#include "core/tensor_parallel_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <exception>
#include <vector>

#include "core/sharded_state_dict.h"
#include "core/state_dict.h"
#include "core/tensor_parallel_splits.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {
namespace {

void refuse_directory(const std::string& path, const char* what) {
  TORCH_CHECK(!is_sharded_state_dict_path(path), "cpprun: ", what, "(\"", path, "\") with tensor parallelism takes "
              "a file (.safetensors, .pt), not a directory in the sharded layout, which is not supported with "
              "tensor parallelism yet.");
}

// The distinct tensor-parallel groups of `splits`, in the same order on every rank.
std::vector<ProcessGroup> groups_of(const std::map<std::string, TensorParallelSplit>& splits) {
  std::vector<const ProcessGroup*> groups;
  for (const auto& [name, split] : splits) groups.push_back(&split.group);
  return distinct_groups(groups);
}

// Every rank learns whether any failed: over the tensor-parallel groups, then across the
// data-parallel one (a {dp, tp} layout reaches every rank so). Rethrows this rank's error; on the
// others throws one naming `what`. Also a barrier.
void agree(const std::vector<ProcessGroup>& groups, const ProcessGroup* data_parallel, std::exception_ptr failure,
           const std::string& what) {
  auto failed = at::tensor({failure ? 1 : 0}, at::kInt);
  for (const auto& group : groups) all_reduce(group, failed, ReduceOp::kMax);
  if (data_parallel) all_reduce(*data_parallel, failed, ReduceOp::kMax);
  if (failure) std::rethrow_exception(failure);
  TORCH_CHECK(failed.item<int>() == 0, "cpprun: ", what, " failed on another rank; its log has the error.");
}

}  // namespace

at::Tensor gather_tensor_parallel_split(const at::Tensor& shard, const TensorParallelSplit& split) {
  const int64_t ranks = split.group.size();
  const int64_t dim = split.dim < 0 ? split.dim + shard.dim() : split.dim;
  TORCH_CHECK(dim >= 0 && dim < shard.dim() && shard.size(dim) % split.parts == 0, "cpprun: a tensor-parallel "
              "split says dim ", split.dim, " in ", split.parts, " parts, which a shard of shape ", shard.sizes(),
              " does not have.");
  auto gathered = at::empty({ranks * shard.numel()}, shard.options());
  all_gather_into(split.group, gathered, shard.detach().contiguous().view(-1));
  // Rank r's shard is [chunk r of block 0, chunk r of block 1, ...]; the whole tensor wants the
  // blocks in order, and within each the ranks' chunks in rank order.
  const auto shards = gathered.chunk(ranks);
  std::vector<at::Tensor> in_order;
  for (int64_t block = 0; block < split.parts; ++block) {
    for (int64_t r = 0; r < ranks; ++r) {
      in_order.push_back(shards[r].view(shard.sizes()).chunk(split.parts, dim)[block]);
    }
  }
  return at::cat(in_order, dim);
}

at::Tensor tensor_parallel_shard(const at::Tensor& whole, const TensorParallelSplit& split) {
  const int64_t ranks = split.group.size();
  const int64_t dim = split.dim < 0 ? split.dim + whole.dim() : split.dim;
  TORCH_CHECK(dim >= 0 && dim < whole.dim() && whole.size(dim) % (ranks * split.parts) == 0, "cpprun: a tensor of "
              "shape ", whole.sizes(), " cannot be split along dim ", split.dim, " into ", split.parts, " parts of ",
              ranks, " ranks each.");
  std::vector<at::Tensor> mine;
  for (const auto& block : whole.chunk(split.parts, dim)) mine.push_back(block.chunk(ranks, dim)[split.group.rank()]);
  return at::cat(mine, dim);
}

void save_tensor_parallel_state_dict(torch::nn::Module& module, const ProcessGroup* data_parallel,
                                     const std::map<std::string, TensorParallelSplit>& splits, const std::string& path,
                                     const StateDictSaveOptions& options) {
  refuse_directory(path, "save_state_dict");
  check_state_dict_path(path);
  at::NoGradGuard no_grad;
  NamedTensors state = module_state(module);
  for (auto& [name, tensor] : state) {  // the same order on every rank: each gather meets its peers'
    const auto split = splits.find(name);
    if (split != splits.end()) tensor = gather_tensor_parallel_split(tensor, split->second);
  }
  const auto groups = groups_of(splits);
  bool writer = !data_parallel || data_parallel->rank() == 0;
  for (const auto& group : groups) writer = writer && group.rank() == 0;
  std::exception_ptr failure;
  if (writer) {
    try {
      write_state_dict_file(state, path, options);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  agree(groups, data_parallel, failure, "saving the state dict to " + path + " (by the rank first in every group)");
}

StateDictLoadReport load_tensor_parallel_state_dict(torch::nn::Module& module, const ProcessGroup* data_parallel,
                                                    const std::map<std::string, TensorParallelSplit>& splits,
                                                    const std::string& path, const StateDictOptions& options) {
  refuse_directory(path, "load_state_dict");
  StateDictLoadReport report;
  std::exception_ptr failure;
  try {
    // As load_state_dict_file reads it, then each split tensor of the whole shape cut to this
    // rank's part; one of another shape is left so, and strict loading names it as a mismatch.
    NamedTensors file = read_state_dict_file(path);
    std::map<std::string, at::Tensor> mine;
    for (const auto& [name, tensor] : module_state(module)) mine.emplace(name, tensor);
    for (auto& [name, tensor] : file) {
      const std::string as_module = options.file_key_prefix() + name;
      const auto split = splits.find(as_module);
      const auto local = mine.find(as_module);
      if (split == splits.end() || local == mine.end()) continue;
      const int64_t dim = split->second.dim < 0 ? split->second.dim + local->second.dim() : split->second.dim;
      if (dim < 0 || dim >= local->second.dim()) continue;  // left to the shape comparison
      auto whole_shape = local->second.sizes().vec();
      whole_shape[static_cast<std::size_t>(dim)] *= split->second.group.size();
      if (tensor.sizes() == at::IntArrayRef(whole_shape)) tensor = tensor_parallel_shard(tensor, split->second);
    }
    report = load_named_tensors(module_state(module), file, path, options);
  } catch (...) {
    failure = std::current_exception();
  }
  // A rank that could not read the file must not leave the others waiting in the next collective.
  agree(groups_of(splits), data_parallel, failure, "loading the state dict from " + path);
  return report;
}

}  // namespace cpprun::detail
