// One stage's backward in two parts, for zero-bubble schedules: first the gradient of the stage's
// input (what the previous stage waits for), later the gradients of its weights (which nobody
// waits for, so they can fill time the stage would otherwise idle).
//
// How (as torch.distributed.pipelining's stage_backward_input / stage_backward_weight): the
// autograd graph from the outputs is walked once. A weight's gradient leaves the input's path at
// the nodes where both meet (a linear layer's addmm computes the input's gradient and the
// weight's); pre-hooks on those nodes keep the gradient arriving there while the input pass runs
// with retain_graph, computing only what the input needs. The weight pass then starts the engine
// at those nodes with what was kept, and computes only what the weights need. Weights whose
// paths meet the input's at the same node are one group and go in one engine call; each group
// goes in its own, so that no call re-enters the input's path.
//
// Where the split would be wrong or pointless the input pass runs the whole backward and the
// weight pass does nothing: an input that needs no gradient (the first stage's token ids), a
// weight reached from the outputs without meeting the input's path, and a weight used at two
// places of which one lies below the other on the input's path (a layer applied twice: the
// weight pass would reach the lower place both from the upper one and from what was kept).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace cpprun::detail {

class SplitBackward {
 public:
  // The input pass: the gradient of `input` from `outputs` (with `output_grads`; none for a
  // scalar loss, as backward()), into input_grad(); zeros where the outputs do not depend on it.
  // `weights`: the parameters whose gradients the weight pass accumulates (those the outputs do
  // not depend on are left alone).
  SplitBackward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& output_grads,
                const at::Tensor& input, const std::vector<at::Tensor>& weights);
  ~SplitBackward();
  SplitBackward(const SplitBackward&) = delete;
  SplitBackward& operator=(const SplitBackward&) = delete;

  // Undefined when the input needs no gradient.
  const at::Tensor& input_grad() const { return input_grad_; }
  // Whether the weights' gradients wait for backward_weights() (false: the input pass did it all).
  bool split() const { return !groups_.empty(); }
  // The weight pass: accumulates into the weights' .grad as backward() would have; then lets the
  // graph go. Once.
  void backward_weights();

 private:
  struct Group;
  std::vector<std::unique_ptr<Group>> groups_;
  at::Tensor input_grad_;
};

}  // namespace cpprun::detail
