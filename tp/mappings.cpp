// The tensor-parallel mappings (cpprun/tensor_parallel_mappings.h): each a torch::autograd::Function
// whose forward and backward are one collective (or none) on the TP group. The collectives are
// comm/'s; this file only decides which runs in which direction.
#include "cpprun/tensor_parallel_mappings.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <c10/util/Exception.h>

#include "cpprun/collectives.h"
#include "tp/autograd_group.h"
#include "tp/tp_collectives.h"

namespace cpprun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using tp::save_group;
using tp::saved_group;

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup group) {
    save_group(ctx, group);
    return input;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {tp::all_reduce_sum(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup group) {
    return tp::all_reduce_sum(input, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// Split along `dim` in forward (keep this rank's chunk), all-gather in backward.
struct ScatterAlong : torch::autograd::Function<ScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup group, int64_t dim,
                            const char* what) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return tp::chunk_along(input, group, dim, what);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {tp::all_gather_along(grads[0], saved_group(ctx), dim, "the backward of a scatter"), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// All-gather along `dim` in forward; backward keeps this rank's chunk of the gradient (the
// tensor-parallel region: every rank computed the same full gradient) or reduce-scatters it
// (sequence parallelism: each rank's gradient is a partial sum over its own heads/columns).
struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup group, int64_t dim,
                            bool reduce_scatter_grad, const char* what) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reduce_scatter"] = reduce_scatter_grad;
    return tp::all_gather_along(input, group, dim, what);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const ProcessGroup& group = saved_group(ctx);
    at::Tensor grad = ctx->saved_data["reduce_scatter"].toBool()
                          ? tp::reduce_scatter_along(grads[0], group, dim, "the backward of an all-gather")
                          : tp::chunk_along(grads[0], group, dim, "the backward of an all-gather");
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ProcessGroup group, int64_t dim,
                            const char* what) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return tp::reduce_scatter_along(input, group, dim, what);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {tp::all_gather_along(grads[0], saved_group(ctx), dim, "the backward of a reduce-scatter"),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

int64_t wrap(const at::Tensor& input, int64_t dim) { return at::maybe_wrap_dim(dim, input.dim()); }

}  // namespace

at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group) {
  return CopyToRegion::apply(input, group);
}

at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group) {
  return ReduceFromRegion::apply(input, group);
}

at::Tensor scatter_to_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group) {
  return ScatterAlong::apply(input, group, wrap(input, -1), "scatter_to_tensor_parallel_region");
}

at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input, const ProcessGroup& group) {
  return GatherAlong::apply(input, group, wrap(input, -1), false, "gather_from_tensor_parallel_region");
}

at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group, int64_t dim) {
  return ScatterAlong::apply(input, group, wrap(input, dim), "scatter_to_sequence_parallel_region");
}

at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group, int64_t dim) {
  return GatherAlong::apply(input, group, wrap(input, dim), true, "gather_from_sequence_parallel_region");
}

at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, const ProcessGroup& group,
                                                      int64_t dim) {
  return ReduceScatterAlong::apply(input, group, wrap(input, dim), "reduce_scatter_to_sequence_parallel_region");
}

}  // namespace cpprun
