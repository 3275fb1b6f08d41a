// See split_backward.h.
#include "pipeline/split_backward.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace cpprun::detail {

namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;
// A strong reference to a node: std::shared_ptr in older LibTorch, c10::intrusive_ptr in newer.
using NodeRef = decltype(Edge::function);

// Keeps the gradient arriving at a node (its inputs, in autograd's terms) while the input pass runs.
class KeepArrivingGradient : public torch::autograd::FunctionPreHook {
 public:
  explicit KeepArrivingGradient(variable_list* into) : into_(into) {}
  variable_list operator()(const variable_list& grads) override {
    *into_ = grads;
    return grads;
  }

 private:
  variable_list* into_;
};

// Note [Tensor hooks at a meeting node]
// What a meeting node's pre-hook keeps arrived after the node's tensor hooks ran (a hook registered
// on the tensor the node made, h.register_hook, and retain_grad's), in the input pass. The weight
// pass starts the engine at that node, which runs them again: a hook that scales the gradient
// scaled the weights' part twice (PyTorch 2.15's stage_backward_weight does the same). They are
// set aside while the weight pass runs from the node, so that each runs once, as in one backward.
class TensorHooksSetAside {
 public:
  explicit TensorHooksSetAside(const std::vector<NodeRef>& nodes) {
    for (const auto& node : nodes) {
      held_.push_back({node.get(), std::move(node->tensor_pre_hooks()), std::move(node->retains_grad_hooks())});
      node->tensor_pre_hooks().clear();
      node->retains_grad_hooks().clear();
    }
  }
  ~TensorHooksSetAside() {
    for (auto& held : held_) {
      held.node->tensor_pre_hooks() = std::move(held.tensor_hooks);
      held.node->retains_grad_hooks() = std::move(held.retains_grad);
    }
  }
  TensorHooksSetAside(const TensorHooksSetAside&) = delete;
  TensorHooksSetAside& operator=(const TensorHooksSetAside&) = delete;

 private:
  struct Held {
    Node* node;
    std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>> tensor_hooks;
    std::unordered_map<size_t, std::unique_ptr<torch::autograd::FunctionPreHook>> retains_grad;
  };
  std::vector<Held> held_;
};

// The graph reached from the outputs: each node with the nodes whose edges lead to it.
struct Graph {
  std::unordered_map<Node*, NodeRef> nodes;
  std::unordered_map<Node*, std::vector<Node*>> toward_outputs;
};

Graph walk_from(const edge_list& roots) {
  Graph graph;
  std::deque<Node*> queue;
  for (const Edge& root : roots) {
    if (root.function && graph.nodes.emplace(root.function.get(), root.function).second) queue.push_back(root.function.get());
  }
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (const Edge& next : node->next_edges()) {
      if (!next.function) continue;
      graph.toward_outputs[next.function.get()].push_back(node);
      if (graph.nodes.emplace(next.function.get(), next.function).second) queue.push_back(next.function.get());
    }
  }
  return graph;
}

// The nodes from which `from` is reached (the outputs' side of it), `from` included.
std::unordered_set<Node*> above(Node* from, const Graph& graph) {
  std::unordered_set<Node*> seen{from};
  std::deque<Node*> queue{from};
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    auto it = graph.toward_outputs.find(node);
    if (it == graph.toward_outputs.end()) continue;
    for (Node* parent : it->second) {
      if (seen.insert(parent).second) queue.push_back(parent);
    }
  }
  return seen;
}

// Where a weight's gradient path meets the input's (`on_input_path`): going from the weight toward
// the outputs, the first nodes on it. False when some path reaches an output without meeting it.
bool meeting_nodes(Node* weight, const Graph& graph, const std::unordered_set<Node*>& on_input_path,
                   std::vector<Node*>& met) {
  std::unordered_set<Node*> seen{weight};
  std::deque<Node*> queue{weight};
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    auto it = graph.toward_outputs.find(node);
    if (it == graph.toward_outputs.end() || it->second.empty()) return false;  // an output's own node
    for (Node* parent : it->second) {
      if (!seen.insert(parent).second) continue;
      if (on_input_path.count(parent)) met.push_back(parent);
      else queue.push_back(parent);
    }
  }
  return true;
}

// Whether going from `from` toward the inputs, through nodes on the input's path, reaches one of `targets`.
bool reaches(Node* from, const std::unordered_set<Node*>& targets, const std::unordered_set<Node*>& on_input_path) {
  std::unordered_set<Node*> seen{from};
  std::deque<Node*> queue{from};
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (const Edge& next : node->next_edges()) {
      Node* child = next.function.get();
      if (child == nullptr || !on_input_path.count(child) || !seen.insert(child).second) continue;
      if (targets.count(child)) return true;
      queue.push_back(child);
    }
  }
  return false;
}

}  // namespace

// Weights whose gradient paths meet the input's at the same nodes, and what arrived at those nodes.
struct SplitBackward::Group {
  std::vector<NodeRef> meeting;
  std::vector<variable_list> arrived;  // per meeting node, kept by its pre-hook
  edge_list weights;                   // their gradient accumulators
};

SplitBackward::SplitBackward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& output_grads,
                             const at::Tensor& input, const std::vector<at::Tensor>& weights) {
  TORCH_INTERNAL_ASSERT(output_grads.empty() || output_grads.size() == outputs.size());
  std::vector<at::Tensor> roots, root_grads;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !outputs[k].requires_grad()) continue;
    roots.push_back(outputs[k]);
    root_grads.push_back(output_grads.empty() ? at::ones_like(outputs[k]) : output_grads[k]);
  }
  const bool input_needs_grad = input.defined() && input.requires_grad();
  auto whole_backward = [&] {
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    if (input_needs_grad) input_grad_ = input.grad().defined() ? input.grad() : at::zeros_like(input);
  };
  if (roots.empty() || !input_needs_grad || !input.is_leaf()) {
    whole_backward();
    return;
  }

  edge_list root_edges;
  for (const auto& root : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(root));
  const Graph graph = walk_from(root_edges);
  Node* input_node = torch::autograd::impl::gradient_edge(input).function.get();
  if (!graph.nodes.count(input_node)) {  // the outputs do not depend on the input
    whole_backward();
    return;
  }
  const std::unordered_set<Node*> on_input_path = above(input_node, graph);

  // Group the weights by the nodes where their paths meet the input's.
  struct Pending {
    std::unordered_set<Node*> meeting;
    edge_list weights;
  };
  std::vector<Pending> pending;
  for (const auto& weight : weights) {
    if (!weight.defined() || !weight.requires_grad() || !weight.is_leaf()) continue;
    Edge accumulator = torch::autograd::impl::gradient_edge(weight);
    if (!graph.nodes.count(accumulator.function.get())) continue;  // the outputs do not depend on it
    std::vector<Node*> met;
    if (!meeting_nodes(accumulator.function.get(), graph, on_input_path, met) || met.empty()) {
      whole_backward();
      return;
    }
    Pending group{{met.begin(), met.end()}, {accumulator}};
    for (auto it = pending.begin(); it != pending.end();) {
      const bool shares = std::any_of(met.begin(), met.end(), [&](Node* n) { return it->meeting.count(n) > 0; });
      if (!shares) {
        ++it;
        continue;
      }
      group.meeting.insert(it->meeting.begin(), it->meeting.end());
      group.weights.insert(group.weights.end(), it->weights.begin(), it->weights.end());
      it = pending.erase(it);
    }
    pending.push_back(std::move(group));
  }
  for (const Pending& group : pending) {
    for (Node* node : group.meeting) {
      if (reaches(node, group.meeting, on_input_path)) {  // a weight used twice, one use below the other
        whole_backward();
        return;
      }
    }
  }

  // Keep what arrives at the meeting nodes while the input's gradient is computed.
  std::vector<std::pair<Node*, torch::autograd::FunctionPreHook*>> hooks;
  for (const Pending& p : pending) {
    auto group = std::make_unique<Group>();
    group->weights = p.weights;
    group->arrived.resize(p.meeting.size());
    size_t k = 0;
    for (Node* node : p.meeting) {
      group->meeting.push_back(graph.nodes.at(node));
      auto hook = std::make_unique<KeepArrivingGradient>(&group->arrived[k++]);
      hooks.emplace_back(node, hook.get());
      node->add_pre_hook(std::move(hook));
    }
    groups_.push_back(std::move(group));
  }
  auto remove_hooks = [&] {
    for (auto [node, hook] : hooks) {
      auto& list = node->pre_hooks();
      list.erase(std::remove_if(list.begin(), list.end(), [hook = hook](const auto& h) { return h.get() == hook; }),
                 list.end());
    }
  };
  variable_list grads;
  try {
    grads = torch::autograd::grad(roots, {input}, root_grads, /*retain_graph=*/true, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  } catch (...) {
    remove_hooks();
    groups_.clear();
    throw;
  }
  remove_hooks();
  input_grad_ = grads.at(0).defined() ? grads[0] : at::zeros_like(input);
}

SplitBackward::~SplitBackward() = default;

void SplitBackward::backward_weights() {
  auto& engine = torch::autograd::Engine::get_default_engine();
  for (const auto& group : groups_) {
    edge_list starts;
    variable_list grads;
    for (size_t k = 0; k < group->meeting.size(); ++k) {
      const variable_list& arrived = group->arrived[k];
      for (size_t i = 0; i < arrived.size(); ++i) {
        if (!arrived[i].defined()) continue;
        starts.emplace_back(group->meeting[k], static_cast<uint32_t>(i));
        grads.push_back(arrived[i]);
      }
    }
    if (starts.empty()) continue;  // nothing arrived (undefined gradients): the whole backward gave none either
    const TensorHooksSetAside once(group->meeting);  // See Note [Tensor hooks at a meeting node]
    engine.execute(starts, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/true,
                   group->weights);
  }
  groups_.clear();
}

}  // namespace cpprun::detail
