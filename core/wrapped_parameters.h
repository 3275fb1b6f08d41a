// Which live parameters a data-parallel wrapper holds, so that wrapping them again, or splitting
// them for tensor parallelism after wrapping, is refused by name rather than training wrong. See
// Note [One data-parallel wrapper per parameter] in wrapped_parameters.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace cpprun::detail {

// While it lives, `params` are noted as held by `wrapper` ("cpprun::DistributedDataParallel",
// "cpprun::FullyShardedDataParallel"; a string literal). Each wrapper's core holds one.
class WrappedParameters {
 public:
  WrappedParameters(const char* wrapper, const std::vector<at::Tensor>& params);
  ~WrappedParameters();
  WrappedParameters(const WrappedParameters&) = delete;
  WrappedParameters& operator=(const WrappedParameters&) = delete;

 private:
  std::vector<const c10::TensorImpl*> params_;
};

// Which wrappers to refuse: any, or only FSDP (DDP over DDP reduces twice, to the same average).
enum class RefuseWrapped { kAny, kSharded };

// Throws, naming the first of `module`'s parameters that a live wrapper holds and that wrapper,
// when `who` ("cpprun::FullyShardedDataParallel", "cpprun::parallelize_module") may not take it.
// `prefix`: `module`'s name in the model, before its parameters' names ("blocks.0.").
void refuse_wrapped_parameters(const torch::nn::Module& module, const char* who, RefuseWrapped which,
                               const std::string& prefix = "");

}  // namespace cpprun::detail
