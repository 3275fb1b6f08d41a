// See cpprun/activation_checkpoint.h.
//
// Note [How a segment is recomputed]
// torch.utils.checkpoint's reentrant form runs the segment under no_grad and, in backward, runs
// it again and calls backward() inside backward. That nested backward is where it breaks under
// data parallelism: the parameters' gradients arrive inside a nested graph task (DDP's and FSDP's
// end-of-backward callbacks would be queued on it and run too early), and a graph walk from the
// loss (DDP's unused-parameter detection) cannot see parameters used only under no_grad.
// LibTorch has no saved-tensor hooks for the non-reentrant form. So:
//  1. The segment runs once with grad mode on, and we walk the graph it built from its outputs to
//     the leaf tensors it used (AccumulateGrad nodes): its parameters. The outputs are then
//     detached and that graph dropped, which frees the segment's activations.
//  2. A custom autograd node takes the inputs *and those parameters* as its inputs and returns the
//     detached outputs. The parameters are now edges of the real graph: DDP sees them as used,
//     and their gradients reach them through their own AccumulateGrad in the outer backward, so
//     DDP's and FSDP's gradient hooks fire there as they would without checkpointing.
//  3. Its backward restores the random-number generators and autocast state of step 1, runs the
//     segment again, and computes the gradients of the inputs and parameters with
//     torch::autograd::grad (which captures them rather than accumulating into .grad), then
//     returns them as the node's input gradients. Under ZeRO-3, running the segment again
//     gathers its units as any use does; they are released when their gradients are done.
#include "cpprun/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>
#include <utility>

namespace cpprun {
namespace {

using Function = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// The generators the segment may draw from: the CPU's and those of the inputs' CUDA devices (as
// torch.utils.checkpoint), and the autocast state it ran under.
class ReplayState {
 public:
  explicit ReplayState(const std::vector<at::Tensor>& inputs) {
    devices_.push_back(at::Device(at::kCPU));
    for (const auto& t : inputs) {
      if (t.defined() && t.is_cuda() &&
          std::find(devices_.begin(), devices_.end(), t.device()) == devices_.end()) {
        devices_.push_back(t.device());
      }
    }
    for (const auto& device : devices_) states_.push_back(state_of(device));
    for (auto type : {at::kCPU, at::kCUDA}) {
      autocast_.push_back({type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
    }
  }

  // Runs `body` with the generators and autocast as they were at construction, then puts back
  // what they are now: the recomputation must not change what later code draws. Under autocast
  // the recomputation is a region of its own, as torch.utils.checkpoint's `with torch.autocast`:
  // leaving it empties autocast's cache of casts of leaf tensors when no region encloses it.
  // Kept, a cast made here would outlive the optimizer's step and be the next forward's: a stale
  // copy of the weight, and one made before that forward's segment ran, which the graph walk
  // below refuses.
  template <typename Body>
  auto replay(Body&& body) const {
    std::vector<at::Tensor> now;
    for (const auto& device : devices_) now.push_back(state_of(device));
    std::vector<Autocast> autocast_now;
    for (const auto& a : autocast_) {
      autocast_now.push_back({a.type, at::autocast::is_autocast_enabled(a.type), at::autocast::get_autocast_dtype(a.type)});
    }
    set(states_, autocast_);
    const bool autocasting = std::any_of(autocast_.begin(), autocast_.end(), [](const Autocast& a) { return a.enabled; });
    if (autocasting) at::autocast::increment_nesting();
    struct Restore {
      const ReplayState& self;
      const std::vector<at::Tensor>& states;
      const std::vector<Autocast>& autocast;
      bool autocasting;
      ~Restore() {
        if (autocasting && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        self.set(states, autocast);
      }
    } restore{*this, now, autocast_now, autocasting};
    return body();
  }

 private:
  struct Autocast {
    at::DeviceType type;
    bool enabled;
    at::ScalarType dtype;
  };

  static at::Tensor state_of(const at::Device& device) {
    auto generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  void set(const std::vector<at::Tensor>& states, const std::vector<Autocast>& autocast) const {
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      auto generator = at::globalContext().defaultGenerator(devices_[i]);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(states[i]);
    }
    for (const auto& a : autocast) {
      at::autocast::set_autocast_enabled(a.type, a.enabled);
      at::autocast::set_autocast_dtype(a.type, a.dtype);
    }
  }

  std::vector<at::Device> devices_;
  std::vector<at::Tensor> states_;
  std::vector<Autocast> autocast_;
};

// The inputs as leaves of their own, so that a graph walk stops at them and torch::autograd::grad
// can differentiate with respect to them.
std::vector<at::Tensor> as_leaves(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) {
    leaves.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
  }
  return leaves;
}

// The leaf tensors requiring grad (parameters) that `outputs` were computed from, other than
// `inputs`, in the order first reached. A non-leaf from before the segment started (a captured
// activation) cannot be given a gradient by the node: refused.
std::vector<at::Tensor> parameters_reached(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                           uint64_t first_sequence_nr) {
  std::unordered_set<const c10::TensorImpl*> input_impls;
  for (const auto& t : inputs) {
    if (t.defined()) input_impls.insert(t.unsafeGetTensorImpl());
  }
  std::vector<at::Tensor> parameters;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      const at::Tensor& leaf = accumulate->variable;
      if (!input_impls.count(leaf.unsafeGetTensorImpl())) parameters.push_back(leaf);
      continue;
    }
    TORCH_CHECK(node->sequence_nr() >= first_sequence_nr,
                "cpprun::checkpoint: the checkpointed function used a tensor that requires grad but is neither one of "
                "its inputs nor a parameter (it was computed before the function ran, by ",
                node->name(), "). Its gradient could not flow back: pass that tensor to checkpoint() as an input.");
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return parameters;
}

// What backward needs of one checkpointed call: kept by the autograd node.
struct Segment : torch::CustomClassHolder {
  Function function;
  ReplayState replay;
  std::vector<at::Tensor> outputs;  // detached, handed to the node's forward
  std::vector<at::Tensor> constant_outputs;  // of those, the ones that did not require grad
  Segment(Function f, ReplayState r) : function(std::move(f)), replay(std::move(r)) {}
};

class CheckpointNode : public torch::autograd::Function<CheckpointNode> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<Segment> segment, at::TensorList inputs,
                                                at::TensorList parameters) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    ctx->saved_data["parameters"] = at::IValue(c10::List<at::Tensor>(parameters.vec()));
    std::vector<at::Tensor> outputs = std::move(segment->outputs);
    segment->outputs.clear();
    // An output that needed no gradient (e.g. computed from plain data) stays so, as it would be
    // without checkpointing.
    ctx->mark_non_differentiable(segment->constant_outputs);
    segment->constant_outputs.clear();
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto segment = ctx->saved_data["segment"].toCapsule();
    auto& self = *static_cast<Segment*>(segment.get());
    const std::vector<at::Tensor> parameters = ctx->saved_data["parameters"].toTensorList().vec();
    const std::vector<at::Tensor> inputs = as_leaves(ctx->get_saved_variables());

    std::vector<at::Tensor> outputs = self.replay.replay([&] {
      at::AutoGradMode grad_mode(true);
      return self.function(inputs);
    });

    // Differentiate the outputs that carry a gradient with respect to whatever requires one.
    std::vector<at::Tensor> roots, root_grads, wrt;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<std::size_t> slot;  // position in the node's inputs of each `wrt`
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) wrt.push_back(inputs[i]), slot.push_back(1 + i);
    }
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      wrt.push_back(parameters[i]), slot.push_back(1 + inputs.size() + i);
    }
    // One gradient per argument of forward: the segment (none), then inputs, then parameters.
    torch::autograd::variable_list grads(1 + inputs.size() + parameters.size());
    if (roots.empty() || wrt.empty()) return grads;
    const auto computed = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < computed.size(); ++k) grads[slot[k]] = computed[k];
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const Function& function, const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(function, "cpprun::checkpoint: the function is empty");
  if (!at::GradMode::is_enabled()) return function(inputs);

  auto segment = c10::make_intrusive<Segment>(function, ReplayState(inputs));
  const std::vector<at::Tensor> leaves = as_leaves(inputs);
  std::vector<at::Tensor> parameters;
  {
    const uint64_t first_sequence_nr = at::sequence_number::peek();
    std::vector<at::Tensor> outputs = function(leaves);
    parameters = parameters_reached(outputs, leaves, first_sequence_nr);
    for (auto& out : outputs) {
      if (!out.defined()) continue;
      const bool constant = !out.requires_grad();
      out = out.detach();  // drops the graph, and with it the activations
      if (constant) segment->constant_outputs.push_back(out);
    }
    segment->outputs = std::move(outputs);
  }
  return CheckpointNode::apply(segment, at::TensorList(inputs), at::TensorList(parameters));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& function, const at::Tensor& input) {
  TORCH_CHECK(function, "cpprun::checkpoint: the function is empty");
  // By value: the segment calls it again in backward, after this frame is gone.
  auto outputs = checkpoint([function](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{function(in[0])}; },
                            std::vector<at::Tensor>{input});
  return outputs.at(0);
}

at::Tensor checkpoint_sequential(const std::vector<std::function<at::Tensor(const at::Tensor&)>>& functions,
                                 int64_t segments, const at::Tensor& input) {
  const auto count = static_cast<int64_t>(functions.size());
  TORCH_CHECK(segments >= 1 && segments <= count, "cpprun::checkpoint_sequential: segments must be from 1 to the ",
              "number of functions (", count, "), not ", segments, ".");
  for (const auto& function : functions) TORCH_CHECK(function, "cpprun::checkpoint_sequential: a function is empty");
  // torch.utils.checkpoint.checkpoint_sequential's split: segments - 1 chunks of count / segments
  // functions, each checkpointed, then the rest run as usual, keeping its activations: backward
  // begins with it, so recomputing it would only repeat what forward just did.
  const int64_t size = count / segments;
  at::Tensor x = input;
  int64_t next = 0;
  for (int64_t segment = 0; segment + 1 < segments; ++segment, next += size) {
    // By value: the chunk runs again in backward, after the caller's vector may be gone.
    std::vector<std::function<at::Tensor(const at::Tensor&)>> chunk(functions.begin() + next,
                                                                    functions.begin() + next + size);
    x = checkpoint(
        [chunk = std::move(chunk)](const at::Tensor& h) {
          at::Tensor y = h;
          for (const auto& function : chunk) y = function(y);
          return y;
        },
        x);
  }
  for (; next < count; ++next) x = functions[next](x);
  return x;
}

}  // namespace cpprun
