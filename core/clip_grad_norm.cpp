// See clip_grad_norm.h.
#include "core/clip_grad_norm.h"
#include "comm/public_call.h"

#include <ATen/ATen.h>
#include <ATen/native/ForeachUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/split_parameter_registry.h"
#include "core/tensor_parallel_splits.h"
#include "cpprun/clip_grad_norm.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/data_parallel_core.h"
#include "cpprun/tensor_parallel_split.h"
#include "cpprun/unique_parameters.h"

namespace cpprun::detail {
namespace {

// Note [Clipping as torch.nn.utils.clip_grad_norm_]: PyTorch groups the gradients by device and
// dtype (in its grouping map's order), takes each one's norm in its own dtype with _foreach_norm,
// stacks the norms in that order on the first gradient's device and takes their norm; then
// multiplies every gradient by clamp(total.reciprocal() * max_norm, max=1) after adding 1e-6, a
// tensor of the total's dtype. Where this rank holds
// every gradient (DDP, a plain model) we do exactly that, so the clipped gradients are PyTorch's
// to the bit; where the gradients are spread over ranks (FSDP's shards, tensor-parallel pieces,
// pipeline stages), each rank's part's norm is that of its own gradients, and the parts are
// combined as norm^p sums (maxima for p = inf) in float64, as DTensor combines partial norms.

struct Group {
  c10::Device device = c10::kCPU;
  at::ScalarType dtype = at::kFloat;
  std::vector<size_t> members;  // indices into the grads
};

// The defined gradients by device and dtype: for the norm (`for_norm`) the counted ones, in the
// order PyTorch's clip_grad_norm_ visits its groups (the iteration order of ATen's
// _group_tensors_by_first_tensors_device_and_dtype map, which its Python binding keeps: not the
// order the groups first appear), so that the norms stack as PyTorch stacks them; `skip_empty`
// leaves out empty gradients (spread over ranks: an FSDP shard of padding alone has no magnitude
// to add, and an empty tensor has no infinity norm; PyTorch's, holding every gradient, refuses it).
std::vector<Group> by_device_and_dtype(const std::vector<GradientToClip>& grads, bool for_norm, bool skip_empty) {
  std::vector<size_t> members;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& g = grads[i];
    if (!g.grad.defined() || (for_norm && !g.counted) || (skip_empty && g.grad.numel() == 0)) continue;
    members.push_back(i);
  }
  std::vector<Group> groups;
  if (members.empty()) return groups;
  at::native::nested_optional_tensorvec_t nested(1);
  for (size_t i : members) nested[0].emplace_back(grads[i].grad);
  for (const auto& [key, tensors_and_indices] :
       at::native::_group_tensors_by_first_tensors_device_and_dtype(nested, /*with_indices=*/true)) {
    Group group{key.first, key.second, {}};
    for (const auto index : tensors_and_indices.second) group.members.push_back(members[static_cast<size_t>(index)]);
    groups.push_back(std::move(group));
  }
  return groups;
}

// Note [Clipping a wrapper's gradients]
// The free clip_grad_norm_ sees only this rank's tensors. Given a wrapper (DDP, FSDP) as a module,
// it clips as the wrapper's own model->clip_grad_norm does, over its ranks: the norm of every
// gradient, the same on every rank (for DDP the same as its local one). FSDP's shards given any
// other way (model->parameters(), a module holding the wrapper) hold each rank's rows only: their
// norm would be this rank's part's, and the ranks would clip by different factors (0.374 and 0.452
// where the whole is 0.587, in an audit at 2 ranks), so they are refused, naming the wrapper's
// call. PyTorch needs neither: FSDP2's gradients are DTensors, whose norm torch.nn.utils.
// clip_grad_norm_ combines across ranks itself (torch/nn/utils/clip_grad.py).
std::mutex& clip_registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const torch::nn::Module*, DataParallelCore*>& data_parallel_wrappers() {
  static std::unordered_map<const torch::nn::Module*, DataParallelCore*> wrappers;
  return wrappers;
}
std::unordered_map<const c10::TensorImpl*, std::string>& partial_gradients() {
  static std::unordered_map<const c10::TensorImpl*, std::string> names;
  return names;
}

DataParallelCore* wrapper_core(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  auto it = data_parallel_wrappers().find(&module);
  return it == data_parallel_wrappers().end() ? nullptr : it->second;
}

// See Note [Clipping a wrapper's gradients].
void refuse_partial_gradients(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  if (partial_gradients().empty()) return;
  for (const auto& p : params) {
    auto it = partial_gradients().find(p.unsafeGetTensorImpl());
    TORCH_CHECK(it == partial_gradients().end(), "cpprun::clip_grad_norm_: \"", it->second, "\" is this rank's "
                "shard of a parameter of a FullyShardedDataParallel model: its gradient holds this rank's rows only, so "
                "the norm here would be this rank's part's, and each rank would clip by another factor. Clip with the "
                "wrapper, model->clip_grad_norm(max_norm, norm_type) (or cpprun::clip_grad_norm_(*model, max_norm)), "
                "which combines the shards' norms over the ranks (and, with tensor parallelism inside, each split "
                "parameter's over its tensor-parallel group) and returns the whole model's norm on every rank, as "
                "PyTorch's clip_grad_norm_ does over FSDP2's gradients. LibTorch's torch::nn::utils::clip_grad_norm_ "
                "has the same problem and no check.");
  }
}

// A list's split gradients are combined over their groups, its whole ones counted by each rank:
// that is the whole model's norm only when every rank of a group lists the same parameters, as
// model->parameters() does on each. Lists that differ (a rank leaving out a layer) would combine
// different sets silently, so the ranks of each group compare how many split and whole
// parameters they list first (a 4-number all-reduce), and all refuse alike when they differ.
// A rank that lists none of a group's shards does not join it: the others wait for it until the
// group's timeout, naming the collective.
void refuse_different_lists(const std::vector<GradientToClip>& grads) {
  std::vector<const ProcessGroup*> split_over;
  for (const auto& g : grads) {
    if (g.split_over) split_over.push_back(&*g.split_over);
  }
  if (split_over.empty()) return;
  std::vector<int64_t> group_of_split;
  const std::vector<ProcessGroup> groups = distinct_groups(split_over, &group_of_split);
  std::vector<double> split_count(groups.size(), 0);
  for (const int64_t group : group_of_split) split_count[static_cast<size_t>(group)] += 1;
  const auto whole = static_cast<double>(grads.size() - split_over.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].size() <= 1) continue;
    // The maxima of [split, -split, whole, -whole]: the largest and the smallest counts.
    at::Tensor counts = at::tensor({split_count[i], -split_count[i], whole, -whole}, at::kDouble);
    all_reduce(groups[i], counts, ReduceOp::kMax);
    auto c = counts.accessor<double, 1>();
    std::ostringstream ranks;
    const std::vector<int> members = get_process_group_ranks(groups[i]);
    for (size_t k = 0; k < members.size(); ++k) ranks << (k ? ", " : "") << members[k];
    TORCH_CHECK(c[0] == -c[1] && c[2] == -c[3], "cpprun::clip_grad_norm_: the ranks of the tensor-parallel group "
                "(ranks ", ranks.str(), ") were given different parameter lists: this rank's holds ", split_count[i],
                " parameters split over that group and ", whole, " whole ones; across the group the split ones "
                "number ", -c[1], " to ", c[0], ", the whole ones ", -c[3], " to ", c[2], ". The norm combines each "
                "split gradient's pieces over the group and counts the whole ones on every rank, so it is the "
                "model's only when every rank lists the same parameters: pass model->parameters() (or the same "
                "subset) on each rank, or clip the module, cpprun::clip_grad_norm_(*model, max_norm). Nothing was "
                "changed.");
  }
}

}  // namespace

void register_data_parallel(const torch::nn::Module& wrapper, DataParallelCore& core) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  data_parallel_wrappers()[&wrapper] = &core;
}

void unregister_data_parallel(const torch::nn::Module& wrapper) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  data_parallel_wrappers().erase(&wrapper);
}

void register_partial_gradients(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  for (const auto& [name, tensor] : params) partial_gradients()[tensor.unsafeGetTensorImpl()] = name;
}

void unregister_partial_gradients(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::lock_guard<std::mutex> lock(clip_registry_mutex());
  for (const auto& item : params) partial_gradients().erase(item.second.unsafeGetTensorImpl());
}

std::vector<GradientToClip> module_gradients(const torch::nn::Module& module,
                                             const std::map<std::string, TensorParallelSplit>& splits) {
  std::vector<GradientToClip> grads;
  for (const auto& item : unique_named_parameters(module)) {
    const auto split = splits.find(item.key());
    grads.push_back({item.value().grad(),
                     split == splits.end() ? std::nullopt : std::optional<ProcessGroup>(split->second.group)});
  }
  return grads;
}

double clip_grad_norm(const std::vector<GradientToClip>& grads, const ClipOptions& options, const ProcessGroup* sum_over,
                      const char* who, const ProcessGroup* then_over) {
  const double p = options.norm_type;
  TORCH_CHECK(options.max_norm > 0, who, "::clip_grad_norm: max_norm must be positive, got ", options.max_norm,
              " (PyTorch's would zero every gradient at 0, and turn them around below it).");
  TORCH_CHECK(p > 0, who, "::clip_grad_norm: norm_type must be positive (2: the Euclidean norm; "
              "std::numeric_limits<double>::infinity(): the largest magnitude), got ", p, ".");
  const bool inf_norm = std::isinf(p);
  at::NoGradGuard no_grad;

  // Slot 0: whole gradients; slot 1 + i: those split over the i-th distinct tensor-parallel group.
  std::vector<const ProcessGroup*> split_over;
  std::vector<int64_t> slot_of(grads.size(), 0);
  for (const auto& g : grads) {
    if (g.split_over) split_over.push_back(&*g.split_over);
  }
  std::vector<int64_t> group_of_split;
  const std::vector<ProcessGroup> tp_groups = distinct_groups(split_over, &group_of_split);
  for (size_t i = 0, split = 0; i < grads.size(); ++i) {
    if (grads[i].split_over) slot_of[i] = 1 + group_of_split[split++];
  }

  // Each counted gradient's norm, in its dtype, one _foreach_norm per device and dtype; listed per
  // slot in the groups' order, as PyTorch stacks them.
  // The norms meet on the first gradient's device, as PyTorch's.
  const bool alone = tp_groups.empty() && !sum_over && !then_over;
  const auto slots = static_cast<int64_t>(tp_groups.size()) + 1;
  std::vector<std::vector<at::Tensor>> norms(slots);
  std::optional<c10::Device> first_device;
  for (const auto& g : grads) {
    if (g.grad.defined() && g.counted) {
      first_device = g.grad.device();
      break;
    }
  }
  for (const Group& group : by_device_and_dtype(grads, /*for_norm=*/true, /*skip_empty=*/!alone)) {
    std::vector<at::Tensor> tensors;
    for (size_t i : group.members) tensors.push_back(grads[i].grad);
    const std::vector<at::Tensor> group_norms = at::_foreach_norm(tensors, p);
    for (size_t k = 0; k < group.members.size(); ++k) {
      norms[slot_of[group.members[k]]].push_back(group_norms[k].to(*first_device));
    }
  }
  const auto slot_norm = [&](int64_t slot) { return at::linalg_vector_norm(at::stack(norms[slot]), p); };

  // The total (a tensor: what PyTorch computes the coefficient from) and its value.
  at::Tensor total;
  double total_value = 0;
  if (alone) {
    total = norms[0].empty() ? at::zeros({}, at::kFloat) : slot_norm(0);  // of the norms' dtype
    total_value = total.item<double>();
  } else {
    // Every rank joins every reduction, whatever it holds (an FSDP shard of padding alone has no
    // gradient, a pipeline stage may hold only a tied weight another rank counts): one number a
    // slot. The pieces of each split gradient first, over its TP group; then this rank's sum over
    // the groups that share the gradients out.
    // A slot is [its norm^p (its norm, for p = inf), whether it is NaN]: a maximum may drop a NaN
    // (Gloo's std::max keeps whichever argument comes first), so NaN travels as a flag of its own.
    auto parts = at::zeros({slots, 2}, at::kDouble);
    for (int64_t slot = 0; slot < slots; ++slot) {
      if (norms[slot].empty()) continue;
      const double value = slot_norm(slot).item<double>();
      parts[slot][std::isnan(value) ? 1 : 0] = std::isnan(value) ? 1.0 : inf_norm ? value : std::pow(value, p);
    }
    const ReduceOp combine = inf_norm ? ReduceOp::kMax : ReduceOp::kSum;
    for (size_t i = 0; i < tp_groups.size(); ++i) {
      auto part = parts[static_cast<int64_t>(i) + 1].clone();
      all_reduce(tp_groups[i], part, combine);
      parts[static_cast<int64_t>(i) + 1].copy_(part);
    }
    at::Tensor combined = (inf_norm ? std::get<0>(parts.max(0)) : parts.sum(0)).contiguous();
    if (sum_over) all_reduce(*sum_over, combined, combine);
    if (then_over) all_reduce(*then_over, combined, combine);
    const double value = combined[0].item<double>();
    total_value = combined[1].item<double>() > 0 ? std::numeric_limits<double>::quiet_NaN()
                  : inf_norm                     ? value
                                                 : std::pow(value, 1.0 / p);
    // The same on every rank, in float64; the coefficient in the dtype of this rank's gradients
    // (which the ranks may not share: a rank of one stage need not know another's).
    at::ScalarType dtype = at::kDouble;
    bool any = false;
    for (const auto& g : grads) {
      if (!g.grad.defined()) continue;
      dtype = any ? at::promote_types(dtype, g.grad.scalar_type()) : g.grad.scalar_type();
      any = true;
    }
    total = at::scalar_tensor(total_value, at::TensorOptions().dtype(dtype).device(first_device.value_or(c10::kCPU)));
  }
  TORCH_CHECK(!options.error_if_nonfinite || std::isfinite(total_value), who, "::clip_grad_norm: the total norm of ",
              "order ", p, " of the gradients is non-finite (", total_value, "), so they cannot be clipped; nothing ",
              "was changed. To scale them by it anyway, as PyTorch's error_if_nonfinite=False, leave error_if_nonfinite off.");
  // As PyTorch: every gradient times the clamped coefficient, 1 included (exact), and a NaN total
  // multiplies every gradient by NaN, an infinite one by 0. Python's max_norm / tensor is the
  // tensor's reciprocal times max_norm, which rounds otherwise than a division.
  const at::Tensor coefficient = at::clamp_max((total + 1e-6).reciprocal() * options.max_norm, 1.0);
  for (const Group& group : by_device_and_dtype(grads, /*for_norm=*/false, /*skip_empty=*/false)) {
    std::vector<at::Tensor> tensors;
    for (size_t i : group.members) tensors.push_back(grads[i].grad);
    at::_foreach_mul_(tensors, coefficient.to(group.device));
  }
  return total_value;
}

}  // namespace cpprun::detail

namespace cpprun {

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  detail::PublicCallScope call("cpprun::clip_grad_norm_");
  detail::refuse_partial_gradients(parameters);
  // Tensor-parallel shards are parts of one gradient over their group, as the module overload
  // counts them (Note [Split parameters in a parameter list]).
  std::vector<detail::GradientToClip> grads;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : parameters) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) grads.push_back({p.grad(), detail::split_group_of(p)});
  }
  detail::refuse_different_lists(grads);
  return detail::clip_grad_norm(grads, {max_norm, norm_type, error_if_nonfinite}, nullptr, "cpprun");
}

double clip_grad_norm_(torch::nn::Module& module, double max_norm, double norm_type, bool error_if_nonfinite) {
  detail::PublicCallScope call("cpprun::clip_grad_norm_");
  // See Note [Clipping a wrapper's gradients].
  if (detail::DataParallelCore* core = detail::wrapper_core(module)) {
    return core->clip_grad_norm(max_norm, norm_type, error_if_nonfinite);
  }
  detail::refuse_partial_gradients(module.parameters());
  return detail::clip_grad_norm(detail::module_gradients(module, tensor_parallel_splits(module)),
                                {max_norm, norm_type, error_if_nonfinite}, nullptr, "cpprun");
}

}  // namespace cpprun
