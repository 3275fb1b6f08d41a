// parallelize_module (cpprun/tensor_parallel.h): finds each planned submodule by its dotted name,
// checks that its split divides, and puts the tensor-parallel module in its place. See
// Note [Replacing submodules].
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fnmatch.h>

#include <map>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "comm/group_membership.h"
#include "core/split_parameter_registry.h"
#include "core/wrapped_parameters.h"
#include "cpprun/collectives.h"
#include "cpprun/deferred_init.h"
#include "cpprun/object_collectives.h"
#include "cpprun/tensor_parallel.h"
#include "tp/parallel_layer_checks.h"

namespace cpprun {

std::string Placement::str() const {
  return is_replicate() ? "Replicate()" : "Shard(" + std::to_string(dim) + ")";
}

const char* style_name(const ParallelStyle& style) {
  if (std::holds_alternative<ColwiseParallel>(style)) return "ColwiseParallel";
  if (std::holds_alternative<RowwiseParallel>(style)) return "RowwiseParallel";
  return "SequenceParallel";
}

namespace {

struct Located {
  std::shared_ptr<torch::nn::Module> parent;
  std::string child_name;  // in parent
  std::shared_ptr<torch::nn::Module> child;
};

std::string listed_children(const torch::nn::Module& module) {
  std::ostringstream out;
  const char* sep = "";
  for (const auto& item : module.named_children()) {
    out << sep << '"' << item.key() << '"';
    sep = ", ";
  }
  return sep[0] ? out.str() : "none";
}

Located locate(const std::shared_ptr<torch::nn::Module>& root, const std::string& dotted) {
  TORCH_CHECK(!dotted.empty(), "cpprun::parallelize_module: the plan has an empty submodule name; name a Linear "
              "or Embedding submodule as named_modules() does (e.g. \"mlp.fc1\").");
  Located found{nullptr, "", root};
  std::string path;
  std::istringstream parts(dotted);
  for (std::string part; std::getline(parts, part, '.');) {
    auto children = found.child->named_children();
    auto* next = children.find(part);
    TORCH_CHECK(next != nullptr, "cpprun::parallelize_module: the plan names \"", dotted, "\", but ",
                path.empty() ? std::string("the module") : "\"" + path + "\"", " has no submodule \"", part,
                "\" (its submodules: ", listed_children(*found.child), ").");
    found = {found.child, part, *next};
    path += (path.empty() ? "" : ".") + part;
  }
  return found;
}

void check_divides(const std::string& name, const char* style, const char* what, int64_t size, int tp) {
  TORCH_CHECK(size % tp == 0, "cpprun::parallelize_module: ", style, " on \"", name, "\" splits its ", what, " (",
              size, ") over the tensor-parallel group's ", tp, " ranks, and ", size, " does not divide by ", tp,
              "; choose a size that is a multiple of ", tp, " or a smaller tensor-parallel degree (uneven splits "
              "are refused, not padded).");
}

// Note [One plan on every tensor-parallel rank]
// Each planned layer broadcasts its weights and later runs its own collectives: ranks given
// different plans (another entry, another layout) would pair one rank's collective with another's
// and wait until the group's timeout (half an hour by default), or split a layer on one rank only.
// So the ranks compare the plans they were given first, before anything that could fail on one
// rank alone: one all-gather of each rank's description, and a difference refused on every rank,
// naming each rank that differs from rank 0. PyTorch's parallelize_module does not check.
std::string describe_plan(const ParallelizePlan& plan) {
  std::ostringstream out;
  for (const auto& [name, style] : plan) {
    out << (out.tellp() > 0 ? ", " : "") << '"' << name << "\": " << style_name(style) << '(';
    if (const auto* colwise = std::get_if<ColwiseParallel>(&style)) {
      out << colwise->input_layouts().str() << " -> " << colwise->output_layouts().str()
          << (colwise->keep_gathered_input() ? ", keep_gathered_input" : "");
    } else if (const auto* rowwise = std::get_if<RowwiseParallel>(&style)) {
      out << rowwise->input_layouts().str() << " -> " << rowwise->output_layouts().str();
    } else {
      out << "sequence_dim " << std::get<SequenceParallel>(style).sequence_dim();
    }
    out << ')';
  }
  return out.str();
}

void agree_on_plan(const ProcessGroup& group, const ParallelizePlan& plan) {
  if (group.size() == 1) return;
  const std::string mine = describe_plan(plan);
  const std::vector<std::string> all = all_gather_bytes(group, mine);
  for (std::size_t r = 1; r < all.size(); ++r) {
    TORCH_CHECK(all[r] == all[0], "cpprun::parallelize_module: the tensor-parallel group's ranks were given "
                "different plans (every rank must call it with the same plan): rank 0 {", all[0], "}; rank ", r,
                " {", all[r], "}.");
  }
}

// PyTorch's own order (build on the meta device, parallelize_module, then to_empty() and an
// initialisation) does not carry over: a deferred parameter has no values to broadcast or cut.
void refuse_deferred(const std::string& name, const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters()) {
    TORCH_CHECK(!is_deferred(item.value()), "cpprun::parallelize_module: \"", name, ".", item.key(), "\" is a deferred "
                "parameter (built under cpprun::deferred_init and not yet materialised): it has no values to split. "
                "Call cpprun::materialize(model) first, then parallelize_module (then FullyShardedDataParallel or "
                "DDP, if any).");
  }
}

// The full parameters as the group's rank 0 has them, so that every rank cuts the same tensor.
void agree_on_parameters(torch::nn::Module& module, const ProcessGroup& group) {
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters()) broadcast(group, p.detach(), 0);
}

// Whether `style` applies to `child` and its split divides by `tp`: refused naming the entry.
// Made for every entry before any is built, so that a plan with a mistake leaves the module whole.
void check_plannable(const std::string& name, torch::nn::Module& child, const ParallelStyle& style, int tp) {
  if (std::get_if<SequenceParallel>(&style)) {
    auto* dropout = dynamic_cast<torch::nn::DropoutImpl*>(&child);
    TORCH_CHECK(dropout || dynamic_cast<torch::nn::LayerNormImpl*>(&child),
                "cpprun::parallelize_module: \"", name, "\" is a ", child.name(), "; SequenceParallel "
                "applies to torch::nn::LayerNorm and torch::nn::Dropout only (other parameter-free modules, such "
                "as GELU, need no plan entry).");
    if (dropout) detail::check_sequence_parallel_dropout(dropout->options);
    return;
  }
  auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&child);
  auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&child);
  TORCH_CHECK(linear || embedding, "cpprun::parallelize_module: \"", name, "\" is a ", child.name(), "; ",
              style_name(style), " applies to torch::nn::Linear and torch::nn::Embedding modules only (a "
              "submodule parallelized already cannot be planned twice).");
  // The layers' own refusals (tp/parallel_layer_checks.h) come first, as their constructors make them.
  if (const auto* colwise = std::get_if<ColwiseParallel>(&style)) {
    if (embedding) {
      detail::check_colwise_embedding(embedding->options, *colwise);
      check_divides(name, "ColwiseParallel", "embedding dimension", embedding->weight.size(1), tp);
    } else {
      detail::check_colwise_linear(*colwise);
      check_divides(name, "ColwiseParallel", "output features", linear->options.out_features(), tp);
    }
  } else if (linear) {
    detail::check_rowwise_linear(std::get<RowwiseParallel>(style));
    check_divides(name, "RowwiseParallel", "input features", linear->options.in_features(), tp);
  } else {
    detail::check_vocab_parallel_embedding(embedding->options, std::get<RowwiseParallel>(style));
    check_divides(name, "RowwiseParallel", "vocabulary (num_embeddings)", embedding->weight.size(0), tp);
  }
}

// The parallel module of an entry check_plannable passed: rank 0's values agreed on, this rank's
// part cut from them.
std::shared_ptr<torch::nn::Module> make_parallel(const std::shared_ptr<torch::nn::Module>& child,
                                                 const ParallelStyle& style, const ProcessGroup& group) {
  if (const auto* sequence = std::get_if<SequenceParallel>(&style)) {
    if (auto* dropout = dynamic_cast<torch::nn::DropoutImpl*>(child.get())) {
      return std::make_shared<SequenceParallelDropoutImpl>(*dropout, group, *sequence);
    }
    auto& norm = dynamic_cast<torch::nn::LayerNormImpl&>(*child);
    agree_on_parameters(norm, group);
    return std::make_shared<SequenceParallelLayerNormImpl>(norm, group, *sequence);
  }
  auto* linear = dynamic_cast<torch::nn::LinearImpl*>(child.get());
  auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(child.get());
  if (const auto* colwise = std::get_if<ColwiseParallel>(&style)) {
    if (embedding) {
      agree_on_parameters(*embedding, group);
      return std::make_shared<ColwiseParallelEmbeddingImpl>(*embedding, group, *colwise);
    }
    agree_on_parameters(*linear, group);
    return std::make_shared<ColwiseParallelLinearImpl>(*linear, group, *colwise);
  }
  const auto& rowwise = std::get<RowwiseParallel>(style);
  if (linear) {
    agree_on_parameters(*linear, group);
    return std::make_shared<RowwiseParallelLinearImpl>(*linear, group, rowwise);
  }
  agree_on_parameters(*embedding, group);
  return std::make_shared<VocabParallelEmbeddingImpl>(*embedding, group, rowwise);
}

// The parent's registry, and the lists Sequential, ModuleList and ModuleDict call their entries
// through (a ModuleDict's operator[] and iteration read its own map: a child replaced in the
// registry alone was never called, its shards never trained).
void replace_child(const Located& at, const std::shared_ptr<torch::nn::Module>& replacement) {
  at.parent->replace_module(at.child_name, replacement);
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(at.parent.get())) {
    for (auto& entry : *sequential) {
      if (entry.ptr() != at.child) continue;
      if (auto c = std::dynamic_pointer_cast<ColwiseParallelLinearImpl>(replacement)) entry = torch::nn::AnyModule(c);
      if (auto r = std::dynamic_pointer_cast<RowwiseParallelLinearImpl>(replacement)) entry = torch::nn::AnyModule(r);
      if (auto e = std::dynamic_pointer_cast<VocabParallelEmbeddingImpl>(replacement)) entry = torch::nn::AnyModule(e);
      if (auto e = std::dynamic_pointer_cast<ColwiseParallelEmbeddingImpl>(replacement)) entry = torch::nn::AnyModule(e);
      if (auto n = std::dynamic_pointer_cast<SequenceParallelLayerNormImpl>(replacement)) entry = torch::nn::AnyModule(n);
      if (auto d = std::dynamic_pointer_cast<SequenceParallelDropoutImpl>(replacement)) entry = torch::nn::AnyModule(d);
    }
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(at.parent.get())) {
    for (auto& entry : *list) {
      if (entry == at.child) entry = replacement;
    }
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(at.parent.get())) {
    dict->update({{at.child_name, replacement}});
  }
}

// Note [Wildcards in a plan]
// As PyTorch's parallelize_module, a plan key's dot-separated parts may be fnmatch patterns
// ("layers.*.mlp.fc1", "h.[02].attn"), each matched against the names of the children one level
// down: an entry stands for every submodule it matches. PyTorch warns and skips a key that
// matches nothing; cpprun refuses it, as it refuses a plain name that does not exist (a typo
// would otherwise leave a layer whole without a word). Expanded before anything is located.
bool has_wildcard(const std::string& text) { return text.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand_key(const std::shared_ptr<torch::nn::Module>& root, const std::string& dotted) {
  if (!has_wildcard(dotted)) return {dotted};
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> frontier{{"", root}};
  std::istringstream parts(dotted);
  for (std::string part; std::getline(parts, part, '.');) {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> next;
    for (const auto& [path, module] : frontier) {
      for (const auto& child : module->named_children()) {
        const bool matches = has_wildcard(part) ? fnmatch(part.c_str(), child.key().c_str(), 0) == 0 : child.key() == part;
        if (matches) next.emplace_back(path + (path.empty() ? "" : ".") + child.key(), child.value());
      }
    }
    TORCH_CHECK(!next.empty(), "cpprun::parallelize_module: the plan's \"", dotted, "\" matches no submodule: ",
                "nothing matches \"", part, "\" under ", frontier.size() == 1 && frontier[0].first.empty()
                    ? std::string("the module") : "\"" + frontier[0].first + "\"" +
                                                      (frontier.size() > 1 ? " (and its siblings)" : ""),
                " (its submodules: ", listed_children(*frontier[0].second), ").");
    frontier = std::move(next);
  }
  std::vector<std::string> names;
  for (const auto& [path, module] : frontier) names.push_back(path);
  return names;
}

// A planned module's parameter that some other module also holds (a tied weight: one tensor
// under two names) would be split in the one and whole in the other, and the tie would break
// without a word. Refused, naming both; a head tied to a vocabulary-parallel embedding is
// vocab_parallel_logits instead.
void refuse_broken_ties(torch::nn::Module& module, const ParallelizePlan& plan, const std::vector<Located>& targets) {
  std::map<const c10::TensorImpl*, std::string> planned;  // -> its name under `module`
  for (size_t i = 0; i < plan.size(); ++i) {
    for (const auto& item : targets[i].child->named_parameters()) {
      planned.emplace(item.value().unsafeGetTensorImpl(), plan[i].first + "." + item.key());
    }
  }
  for (const auto& item : module.named_parameters()) {
    const auto found = planned.find(item.value().unsafeGetTensorImpl());
    TORCH_CHECK(found == planned.end() || found->second == item.key(), "cpprun::parallelize_module: \"",
                found->second, "\" and \"", item.key(), "\" are one tensor (tied weights), and the plan splits "
                "it in one of them: the tie would break. For an output layer tied to a vocabulary-parallel "
                "embedding, plan the embedding alone (RowwiseParallel().input_layouts(Replicate())) and compute the "
                "logits with cpprun::vocab_parallel_logits(hidden, embedding), which uses its shard.");
  }
}

}  // namespace

std::shared_ptr<torch::nn::Module> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                      const ProcessGroup& tp_group, const ParallelizePlan& given_plan) {
  TORCH_CHECK(module != nullptr, "cpprun::parallelize_module: the module is null.");
  detail::check_member("parallelize_module", tp_group);
  agree_on_plan(tp_group, given_plan);  // Note [One plan on every tensor-parallel rank], before any rank can fail
  // Note [Wildcards in a plan]: every entry as the submodules it names, each planned once.
  ParallelizePlan plan;
  std::map<std::string, std::string> entry_of;  // a submodule -> the plan key that named it
  for (const auto& [key, style] : given_plan) {
    for (const std::string& name : expand_key(module, key)) {
      const auto [at, first] = entry_of.emplace(name, key);
      TORCH_CHECK(first, "cpprun::parallelize_module: the plan names \"", name, "\" twice",
                  at->second == key && key == name ? std::string(".")
                                                   : " (as \"" + at->second + "\" and as \"" + key + "\").");
      plan.emplace_back(name, style);
    }
  }
  // Every entry is found and checked before anything is replaced: a plan with a typo, a split
  // that does not divide or a layout or option a layer refuses leaves the module whole (and fails
  // alike on every rank). Only what fails while cutting (memory, a collective) can leave it part
  // replaced.
  std::vector<Located> targets;
  for (const auto& [name, style] : plan) targets.push_back(locate(module, name));
  refuse_broken_ties(*module, plan, targets);
  // Note [One data-parallel wrapper per parameter]: a wrapper built first would not see the split.
  for (size_t i = 0; i < plan.size(); ++i) {
    detail::refuse_wrapped_parameters(*targets[i].child, "cpprun::parallelize_module", detail::RefuseWrapped::kAny,
                                      plan[i].first + ".");
  }
  for (size_t i = 0; i < plan.size(); ++i) refuse_deferred(plan[i].first, *targets[i].child);
  for (size_t i = 0; i < plan.size(); ++i) {
    check_plannable(plan[i].first, *targets[i].child, plan[i].second, tp_group.size());
  }
  // Each entry built and put in place in turn, its whole module let go before the next is cut (as
  // PyTorch's parallelize_module goes module by module): built all first, every planned module's
  // whole weights and all their shards were alive at once (a peak of 1.33x PyTorch's: an audit,
  // 2026-12-07). The whole module is freed here unless the caller holds it elsewhere too.
  for (size_t i = 0; i < plan.size(); ++i) {
    replace_child(targets[i], make_parallel(targets[i].child, plan[i].second, tp_group));
    targets[i].child.reset();
  }
  // Layers of one's own in the model, too (Note [Split parameters in a parameter list]).
  detail::register_split_parameters_in(*module);
  return module;
}

std::shared_ptr<torch::nn::Module> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                      const DeviceMesh& mesh, const std::string& tp_dim,
                                                      const ParallelizePlan& plan) {
  return parallelize_module(std::move(module), mesh.group(tp_dim), plan);
}

}  // namespace cpprun
