// SyncBatchNorm (cpprun/sync_batch_norm.h): the group-wide statistics, their gradient, and the
// conversion of BatchNorm{1,2,3}d modules. See Note [SyncBatchNorm].
#include "cpprun/sync_batch_norm.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "comm/group_membership.h"
#include "cpprun/collectives.h"

namespace cpprun {
namespace {

// The backward of an all-reduce sum: the gradient of every rank's loss with respect to this
// rank's contribution is the sum over ranks of their outputs' gradients.
struct AllReduceSumBackward : torch::autograd::Node {
  explicit AllReduceSumBackward(ProcessGroup group) : group(std::move(group)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor grad = grads.at(0).defined() ? grads[0].contiguous().clone() : at::Tensor();
    if (grad.defined()) all_reduce(group, grad);
    return {grad};
  }
  std::string name() const override { return "cpprun::AllReduceSumBackward"; }
  ProcessGroup group;
};

// A node held the way this LibTorch holds them: by c10::intrusive_ptr since 2.15 (Node derives
// from intrusive_ptr_target), by std::shared_ptr before (2.11 on the GPU machine).
template <class NodeType, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>) {
    return c10::make_intrusive<NodeType>(std::forward<Args>(args)...);
  } else {
    return std::make_shared<NodeType>(std::forward<Args>(args)...);
  }
}

// A differentiable all-reduce sum of `local` (a new tensor; `local` is unchanged).
at::Tensor all_reduce_sum_with_grad(const ProcessGroup& group, const at::Tensor& local) {
  at::Tensor global;
  {
    at::NoGradGuard no_grad;
    global = local.detach().clone();
  }
  all_reduce(group, global);
  if (local.requires_grad() && at::GradMode::is_enabled()) {
    auto node = make_node<AllReduceSumBackward>(group);
    node->set_next_edges(torch::autograd::collect_next_edges(local));
    torch::autograd::set_history(global, node);
  }
  return global;
}

void check_input(const at::Tensor& input, int64_t features) {
  TORCH_CHECK(input.dim() >= 2 && input.dim() <= 5, "cpprun::SyncBatchNorm: expected a 2-d to 5-d input "
              "([N, C] or [N, C, spatial...]), got shape ", input.sizes(), ".");
  TORCH_CHECK(input.size(1) == features, "cpprun::SyncBatchNorm: input has ", input.size(1),
              " channels (dim 1, shape ", input.sizes(), ") but the layer was made for ", features, ".");
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, ProcessGroup group)
    : SyncBatchNormImpl(options, std::optional<ProcessGroup>(std::move(group)), Adopted{}) {}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options)
    : SyncBatchNormImpl(options, std::nullopt, Adopted{}) {}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, std::optional<ProcessGroup> group,
                                     Adopted adopted)
    : options(options_),
      group_(group ? std::optional<ProcessGroup>(detail::member_group("SyncBatchNorm", std::move(*group)))
                   : std::nullopt),
      adopted_(std::move(adopted)) {
  reset();
  adopted_ = Adopted{};  // a clone() registers fresh tensors and copies the values
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  auto take = [](const at::Tensor& adopted, at::Tensor fresh) { return adopted.defined() ? adopted : fresh; };
  if (options.affine()) {
    weight = register_parameter("weight", take(adopted_.weight, torch::empty({c})));
    bias = register_parameter("bias", take(adopted_.bias, torch::empty({c})));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", take(adopted_.running_mean, torch::zeros({c})));
    running_var = register_buffer("running_var", take(adopted_.running_var, torch::ones({c})));
    num_batches_tracked =
        register_buffer("num_batches_tracked", take(adopted_.num_batches_tracked, torch::tensor(0, torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  if (!adopted_.weight.defined() && !adopted_.running_mean.defined()) reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats()
         << (group_ ? ", group of " + std::to_string(group_->size()) : std::string(", default group")) << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  check_input(input, options.num_features());
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();  // cumulative average
  }
  if (!is_training()) {
    // Running statistics when tracked, else this rank's batch: no communication, as PyTorch.
    return at::batch_norm(input, weight, bias, running_mean, running_var,
                          /*training=*/!options.track_running_stats(), momentum, options.eps(),
                          at::globalContext().userEnabledCuDNN());
  }
  const int64_t c = options.num_features();
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  std::vector<int64_t> channel_shape(input.dim(), 1);
  channel_shape[1] = c;

  // Sums in float64: E[x^2] - E[x]^2 in float32 loses digits that plain BatchNorm keeps.
  const at::Tensor x = input.to(at::kDouble);
  const double count = static_cast<double>(input.numel() / c);
  at::Tensor local = at::cat({x.sum(dims), (x * x).sum(dims), at::full({1}, count, x.options())});
  // No group given: the default one, looked up now as PyTorch's forward does; without one, this
  // process's batch alone (PyTorch's SyncBatchNorm without torch.distributed).
  const std::optional<ProcessGroup> group = group_ ? group_ : (is_initialized() ? std::optional(default_group())
                                                                                  : std::nullopt);
  at::Tensor global = group ? all_reduce_sum_with_grad(*group, local) : local;
  at::Tensor total = global.narrow(0, 2 * c, 1).detach();
  at::Tensor mean = global.narrow(0, 0, c) / total;
  at::Tensor var = global.narrow(0, c, c) / total - mean * mean;  // biased, as the normalisation uses
  at::Tensor invstd = at::rsqrt(var + options.eps());
  at::Tensor y = (input - mean.to(input.scalar_type()).view(channel_shape)) *
                 invstd.to(input.scalar_type()).view(channel_shape);
  if (options.affine()) y = y * weight.view(channel_shape) + bias.view(channel_shape);

  if (options.track_running_stats()) {
    at::NoGradGuard no_grad;
    const double n = total.item<double>();
    TORCH_CHECK(n > 1, "cpprun::SyncBatchNorm: the group's batch has ", n, " value(s) per channel; "
                "training needs more than one (as BatchNorm).");
    running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_((var.detach() * (n / (n - 1))).to(running_var.scalar_type()), momentum);
  }
  return y;
}

// ---- conversion ----------------------------------------------------------------------------

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          const std::optional<ProcessGroup>& group) {
  TORCH_CHECK(module != nullptr, "cpprun::convert_sync_batchnorm: the module is null.");
  auto adopt = [&](const auto& bn) -> std::shared_ptr<torch::nn::Module> {
    SyncBatchNormImpl::Adopted tensors{bn->weight, bn->bias, bn->running_mean, bn->running_var,
                                       bn->num_batches_tracked};
    auto sync = std::shared_ptr<SyncBatchNormImpl>(new SyncBatchNormImpl(bn->options, group, std::move(tensors)));
    sync->train(bn->is_training());
    return sync;
  };
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) return adopt(bn);
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) return adopt(bn);
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) return adopt(bn);

  for (const auto& child : module->named_children()) {
    auto converted = convert_sync_batchnorm(child.value(), group);
    if (converted == child.value()) continue;
    module->replace_module(child.key(), converted);
    // Containers call their entries through lists of their own, beside the registry.
    if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get())) {
      for (auto& entry : *sequential) {
        if (entry.ptr() == child.value()) entry = torch::nn::AnyModule(std::static_pointer_cast<SyncBatchNormImpl>(converted));
      }
    }
    if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(module.get())) {
      for (auto& entry : *list) {
        if (entry == child.value()) entry = converted;
      }
    }
    if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(module.get())) dict->update({{child.key(), converted}});
  }
  return module;
}

}  // namespace cpprun
