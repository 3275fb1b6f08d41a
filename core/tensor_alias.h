// A tensor that shares another's storage at an offset, without autograd seeing a view. DDP's
// bucket slots and FSDP's unsharded parameters and shards both need it.
#pragma once

#include <ATen/core/Tensor.h>

namespace cpprun::detail {

// A contiguous tensor of `sizes` over `flat`'s storage from element `offset` (relative to
// `flat`'s own start). Made with set_() rather than narrow()/view(): LibTorch's
// Optimizer::zero_grad() calls detach_() on every .grad, which views refuse.
at::Tensor alias_into(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes);

}  // namespace cpprun::detail
