// See tp_collectives.h.
#include "tp/tp_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
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
  try {
    all_gather_into(group, gathered, input.contiguous());
  } catch (const c10::Error& e) {
    // Note [Uneven sequence shards]: each rank gathers group.size() pieces of its own shard's
    // shape, so shards of different lengths (a sequence the TP size does not divide, split by
    // x.chunk(tp, 1)) are a collective mismatch, which comm's check finds before any data moves
    // and every rank beside a differing one reports. No rank can tell alone (its shard is all it
    // sees; checking first would cost a collective per gather), so the mismatch is named here
    // with its usual cause and its fix. Other failures (a timeout, a lost peer) pass unchanged.
    const std::string said = e.what_without_backtrace();
    if (said.find("mismatch: ") == std::string::npos) throw;
    TORCH_CHECK(false, "cpprun::", what, ": the ranks of the tensor-parallel group (", world, " ranks) hold shards "
                "of different shapes to gather along dimension ", dim, " (this rank's, rank ", group.rank(), " of "
                "the group: ", input.sizes(), "). Sequence parallelism needs equal shards: a sequence length that "
                "the tensor-parallel size does not divide, split by x.chunk(", world, ", ", dim, "), gives "
                "shards of different lengths. Make the sequence length a multiple of ", world, " (pad it) before "
                "splitting it; the ranks of one group must also take the same batch.\n", said);
  }
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
