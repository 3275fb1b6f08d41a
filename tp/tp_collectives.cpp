// See tp_collectives.h.
#include "tp/tp_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "cpprun/collectives.h"

namespace cpprun::tp {

void check_divides(const at::Tensor& input, int64_t dim, int world, const char* what) {
  TORCH_CHECK(input.size(dim) % world == 0, "cpprun::", what, ": dimension ", dim, " of the input (shape ",
              input.sizes(), ") has size ", input.size(dim), ", which does not divide by the tensor-parallel group's "
              "size ", world, "; make that dimension a multiple of ", world, " (e.g. pad the sequence).");
}

at::Tensor all_reduce_sum(const at::Tensor& input, const ProcessGroup& group) {
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  if (group.size() > 1) all_reduce(group, out);
  return out;
}

at::Tensor all_reduce_max(const at::Tensor& input, const ProcessGroup& group) {
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  if (group.size() > 1) all_reduce(group, out, ReduceOp::kMax);
  return out;
}

at::Tensor chunk_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what) {
  const int world = group.size();
  check_divides(input, dim, world, what);
  return input.chunk(world, dim)[group.rank()].clone(at::MemoryFormat::Contiguous);
}

at::Tensor all_gather_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what) {
  const int world = group.size();
  if (world == 1) return input.clone(at::MemoryFormat::Contiguous);
  std::vector<int64_t> shape{world};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  at::Tensor gathered = at::empty(shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  all_gather_into(group, gathered, input.contiguous());
  return at::cat(gathered.unbind(0), dim);
}

at::Tensor reduce_scatter_along(const at::Tensor& input, const ProcessGroup& group, int64_t dim, const char* what) {
  const int world = group.size();
  check_divides(input, dim, world, what);
  if (world == 1) return input.clone(at::MemoryFormat::Contiguous);
  at::Tensor stacked = at::stack(input.chunk(world, dim), 0).contiguous();
  at::Tensor out = at::empty(stacked[0].sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  reduce_scatter(group, out, stacked);
  return out;
}

}  // namespace cpprun::tp
