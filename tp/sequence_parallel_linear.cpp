// sequence_parallel_column_linear (cpprun/tensor_parallel_mappings.h): the column-parallel linear
// on sequence shards that keeps only the shard for backward. Composing the mappings
// (linear(gather_from_sequence_parallel_region(x), ...)) gives the same values, but autograd then
// saves the gathered input for the weight's gradient: t times the shard, the one activation of a
// sequence-parallel block that did not fall with t. Megatron-LM keeps the shard and gathers it
// again in backward; so does this.
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <c10/util/Exception.h>

#include "cpprun/tensor_parallel_mappings.h"
#include "tp/autograd_group.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kWhat = "sequence_parallel_column_linear";

struct ColumnLinearOnShards : torch::autograd::Function<ColumnLinearOnShards> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& shard, const at::Tensor& weight,
                            ProcessGroup group, int64_t dim) {
    tp::save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    ctx->save_for_backward({shard, weight});
    return at::linear(tp::all_gather_along(shard, group, dim, kWhat), weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& shard = saved[0];
    const at::Tensor& weight = saved[1];
    const ProcessGroup& group = tp::saved_group(ctx);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const at::Tensor grad = grads[0].contiguous();
    // The same decisions on every rank (the model is the same), so the collectives pair up.
    at::Tensor grad_shard, grad_weight;
    if (ctx->needs_input_grad(1)) {
      const at::Tensor gathered = tp::all_gather_along(shard, group, dim, kWhat);
      grad_weight = grad.reshape({-1, grad.size(-1)}).t().mm(gathered.reshape({-1, gathered.size(-1)}).to(grad.dtype()));
      grad_weight = grad_weight.to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      grad_shard = tp::reduce_scatter_along(grad.matmul(weight.to(grad.dtype())), group, dim, kWhat)
                       .to(shard.scalar_type());
    }
    return {grad_shard, grad_weight, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sequence_parallel_column_linear(const at::Tensor& input_shard, const at::Tensor& weight,
                                           const at::Tensor& bias, const ProcessGroup& group, int64_t dim) {
  TORCH_CHECK(input_shard.dim() >= 2, "cpprun::", kWhat, ": the input has shape ", input_shard.sizes(),
              "; it needs a sequence dimension and a feature dimension.");
  TORCH_CHECK(weight.dim() == 2 && input_shard.size(-1) == weight.size(1), "cpprun::", kWhat, ": the input's last "
              "dimension is ", input_shard.size(-1), ", the weight's shape ", weight.sizes(), " (rows of [out, in]).");
  const int64_t wrapped = at::maybe_wrap_dim(dim, input_shard.dim());
  TORCH_CHECK(wrapped != input_shard.dim() - 1, "cpprun::", kWhat, ": dim ", dim, " is the feature dimension; "
              "the sequence dimension is another (1 in [batch, sequence, hidden]).");
  at::Tensor y = ColumnLinearOnShards::apply(input_shard, weight, group, wrapped);
  // The bias outside the function: adding it saves nothing for backward.
  return bias.defined() ? y + bias : y;
}

}  // namespace cpprun
