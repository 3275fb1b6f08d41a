// Which parameters form which unit (a wrapped module, whose parameters are gathered and released
// together): by module type (wrap_policy), then by size (auto_wrap_min_params), the rest in the
// root unit. Pure: reads the module tree only. param_bucket.h shards units' parameters.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "cpprun/fsdp_options.h"

namespace cpprun::detail {

struct UnitPlan {
  std::string name;  // the unit's module name ("" for the root)
  // Where the walk met the unit's module, parents before children and siblings in order (the
  // root 0): a backward usually finishes units in the reverse of this order (Note [FSDP reduction
  // order] in gradient_sync.cpp).
  std::size_t preorder = 0;
  std::vector<std::string> param_names;
  std::vector<at::Tensor> params;
};

// Units in the order their modules are registered (children before the root unit, which comes
// last). Every parameter takes part, frozen ones (requires_grad false) too, as FSDP2 shards them;
// each tensor once: a tied parameter goes to the first unit that holds it (in that order), under
// its first name. Throws if none requires grad, or if two different tensors share memory.
std::vector<UnitPlan> plan_units(torch::nn::Module& root, const FsdpOptions& options);

}  // namespace cpprun::detail
