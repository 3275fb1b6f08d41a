// Dropout on tensor-parallel shards (cpprun/tensor_parallel.h, Note [Dropout's RNG rule]): the
// whole activation's mask, drawn alike on every rank, and this rank's chunk of it.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <ostream>
#include <vector>

#include "cpprun/tensor_parallel.h"
#include "tp/parallel_layer_checks.h"

namespace cpprun {

void detail::check_sequence_parallel_dropout(const torch::nn::DropoutOptions& options) {
  TORCH_CHECK(!options.inplace(), "cpprun::SequenceParallel: an in-place Dropout is not supported; construct it "
              "with inplace(false).");
}

at::Tensor tensor_parallel_dropout(const at::Tensor& input, double p, bool train, const ProcessGroup& group,
                                   int64_t dim) {
  TORCH_CHECK(p >= 0 && p <= 1, "cpprun::tensor_parallel_dropout: p must be in [0, 1], got ", p, ".");
  TORCH_CHECK(group.is_member(), "cpprun::tensor_parallel_dropout: this rank is not a member of the "
              "tensor-parallel group.");
  if (!train || p == 0) return input;
  TORCH_CHECK(dim >= -input.dim() && dim < input.dim(), "cpprun::tensor_parallel_dropout: dim ", dim,
              " is out of range for an input of shape ", input.sizes(), ".");
  const int64_t d = dim < 0 ? dim + input.dim() : dim;
  std::vector<int64_t> whole = input.sizes().vec();
  whole[static_cast<std::size_t>(d)] *= group.size();
  // As at::dropout on CPU draws it for the whole tensor: bernoulli_(1 - p) over a contiguous
  // tensor of its shape, from the default generator.
  at::Tensor mask = at::empty(whole, input.options()).bernoulli_(1 - p);
  mask = mask.chunk(group.size(), d)[group.rank()];
  if (p == 1) return input * mask;  // all zeros, keeping the graph
  return input * mask.div_(1 - p);
}

SequenceParallelDropoutImpl::SequenceParallelDropoutImpl(const torch::nn::DropoutImpl& full, ProcessGroup group,
                                                         SequenceParallel style)
    : p(full.options.p()), group_(std::move(group)), style_(style) {
  detail::check_sequence_parallel_dropout(full.options);
  TORCH_CHECK(group_.is_member(), "cpprun::SequenceParallelDropout: this rank is not a member of the "
              "tensor-parallel group.");
  train(full.is_training());
}

at::Tensor SequenceParallelDropoutImpl::forward(const at::Tensor& input) {
  return tensor_parallel_dropout(input, p, is_training(), group_, style_.sequence_dim());
}

void SequenceParallelDropoutImpl::pretty_print(std::ostream& stream) const {
  stream << "cpprun::SequenceParallelDropout(p=" << p << ", sequence_dim=" << style_.sequence_dim()
         << ", tp=" << group_.size() << ")";
}

}  // namespace cpprun
