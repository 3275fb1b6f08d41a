// A ProcessGroup kept in an autograd context until backward: saved_data holds IValues only, so the
// group travels in a capsule. Shared by the tensor-parallel autograd functions.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "cpprun/process_group.h"

namespace cpprun::tp {

struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ProcessGroup g) : group(std::move(g)) {}
  ProcessGroup group;
};

inline void save_group(torch::autograd::AutogradContext* ctx, const ProcessGroup& group) {
  ctx->saved_data["group"] = at::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
}

inline const ProcessGroup& saved_group(torch::autograd::AutogradContext* ctx) {
  return static_cast<GroupCapsule*>(ctx->saved_data.at("group").toCapsule().get())->group;
}

}  // namespace cpprun::tp
