// See tensor_alias.h.
#include "core/tensor_alias.h"

#include <ATen/ATen.h>

#include <vector>

namespace cpprun::detail {

at::Tensor alias_into(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  return at::empty({0}, flat.options()).set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
}

}  // namespace cpprun::detail
