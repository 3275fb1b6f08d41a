// See full_state.h.
#include "checkpoint/full_state.h"
#include "comm/public_call.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/archive.h>

#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cpprun/checkpoint_file.h"
#include "cpprun/model_checkpoint.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {
namespace {

std::string joined(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// The whole tensors by name, as the archive holds them: compact (a gathered tensor may view a
// larger buffer, whose padding torch::save would write too), and a parameter requiring grad as
// the module's does, so that the archive's tensors are those of torch::save of the unsplit module.
// One tensor per entry: a tied one is written once, under each of its names, as torch::save does.
std::map<std::string, at::Tensor> archived_tensors(const StateView& view, const NamedTensors& whole) {
  TORCH_INTERNAL_ASSERT(whole.size() == view.names.size());
  std::unordered_map<std::size_t, at::Tensor> of_entry;
  std::map<std::string, at::Tensor> out;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const std::size_t e = view.names[i].second;
    auto found = of_entry.find(e);
    if (found == of_entry.end()) {
      const StateEntry& entry = view.entries[e];
      at::Tensor t = whole[i].second.detach();
      if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) t = t.clone();
      if (entry.parameter && (entry.local.requires_grad() || entry.module_tensor.requires_grad())) t.set_requires_grad(true);
      found = of_entry.emplace(e, t).first;
    }
    out.emplace(whole[i].first, found->second);
  }
  return out;
}

// As Module::save writes `module`, each tensor's value taken from `tensors` by its full name.
void write_module(const torch::nn::Module& module, const std::string& prefix,
                  const std::map<std::string, at::Tensor>& tensors, torch::serialize::OutputArchive& archive) {
  const auto tensor = [&](const std::string& key) -> const at::Tensor& {
    const auto found = tensors.find(joined(prefix, key));
    TORCH_INTERNAL_ASSERT(found != tensors.end(), "no whole tensor for ", joined(prefix, key));
    return found->second;
  };
  for (const auto& item : module.named_parameters(/*recurse=*/false)) archive.write(item.key(), tensor(item.key()));
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    archive.write(item.key(), tensor(item.key()), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;  // as Module::save: e.g. torch::nn::Functional
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    write_module(*child.value(), joined(prefix, child.key()), tensors, child_archive);
    archive.write(child.key(), child_archive);
  }
}

// As Module::load reads `module`: each tensor found goes into `found` by its full name; what is
// not there goes into `missing`.
void read_module(const torch::nn::Module& module, const std::string& prefix, torch::serialize::InputArchive& archive,
                 std::map<std::string, at::Tensor>& found, std::vector<std::string>& missing) {
  const auto read = [&](const std::string& key, bool is_buffer) {
    at::Tensor value;
    if (archive.try_read(key, value, is_buffer)) {
      found[joined(prefix, key)] = value;
    } else {
      missing.push_back("\"" + joined(prefix, key) + "\"");
    }
  };
  for (const auto& item : module.named_parameters(/*recurse=*/false)) read(item.key(), false);
  for (const auto& item : module.named_buffers(/*recurse=*/false)) read(item.key(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    if (archive.try_read(child.key(), child_archive)) {
      read_module(*child.value(), joined(prefix, child.key()), child_archive, found, missing);
    } else {
      missing.push_back("the submodule \"" + joined(prefix, child.key()) + "\"");
    }
  }
}

// The root's part of a load: PATH's tensors into `whole` in place, or an error listing every
// difference with nothing changed.
void read_into(const torch::nn::Module& module, const NamedTensors& whole, const std::string& path) {
  torch::serialize::InputArchive archive;
  // Our own files are checked; one torch::save wrote carries no checksum and is read as it is.
  load_checkpoint(archive, path, UncheckedFiles::kAccept);
  std::map<std::string, at::Tensor> found;
  std::vector<std::string> faults;
  read_module(module, "", archive, found, faults);
  for (auto& fault : faults) fault = "missing " + fault;
  for (const auto& [name, tensor] : whole) {
    const auto in_file = found.find(name);
    if (in_file != found.end() && in_file->second.sizes() != tensor.sizes()) {
      std::ostringstream text;
      text << "\"" << name << "\" has shape " << in_file->second.sizes() << " in the file but " << tensor.sizes()
           << " in the model";
      faults.push_back(text.str());
    }
    // Real numbers convert, as Module::load's copy_ did (a float64 archive into float32
    // parameters; num_batches_tracked saved as a double by a model that went through
    // ->to(kDouble)); a bool or a complex number does not, either way: copy_ would turn true into
    // 1.0, or drop an imaginary part.
    const auto not_real = [](at::ScalarType t) { return t == at::kBool || at::isComplexType(t); };
    if (in_file != found.end() && in_file->second.scalar_type() != tensor.scalar_type() &&
        (not_real(in_file->second.scalar_type()) || not_real(tensor.scalar_type()))) {
      faults.push_back("\"" + name + "\" is " + std::string(c10::toString(in_file->second.scalar_type())) +
                       " in the file but " + c10::toString(tensor.scalar_type()) + " in the model");
    }
  }
  if (!faults.empty()) {
    std::string list;
    for (const auto& fault : faults) list += (list.empty() ? "" : "; ") + fault;
    throw StateDictMismatchError("cpprun: load_full_state_dict: " + path + " does not fit this model (" +
                                 std::to_string(faults.size()) + " difference(s)): " + list +
                                 ". Nothing was loaded. It was saved from another model: save_full_state_dict "
                                 "and torch::save(module) of the same module type write what loads here.");
  }
  at::NoGradGuard no_grad;
  // A float64 archive into float32 parameters converts, as the earlier load did (real numbers
  // only: checked above).
  for (const auto& [name, tensor] : whole) tensor.copy_(found.at(name));
}

}  // namespace

void save_full_state(const StateView& view, const torch::nn::Module& module, const std::string& path) {
  at::NoGradGuard no_grad;
  const NamedTensors whole = whole_state(view);  // collective: every rank gathers
  std::exception_ptr failure;
  if (view.team.is_root()) {
    try {
      torch::serialize::OutputArchive archive;
      write_module(module, "", archived_tensors(view, whole), archive);
      save_checkpoint(archive, path);  // atomic, with a checksum; torch::load still reads it
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  view.team.agree(failure, "saving the full state dict to " + path);
}

void load_full_state(const StateView& view, const torch::nn::Module& module, const std::string& path) {
  at::NoGradGuard no_grad;
  // What the file's tensors replace: whole tensors of the module's shapes on every rank (a
  // replicated one is the module's own, loaded in place).
  const NamedTensors whole = whole_state(view);
  std::exception_ptr failure;
  if (view.team.is_root()) {
    try {
      read_into(module, whole, path);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Only the root reads: the others must not wait for its broadcast if it could not, and they
  // throw its error, of its kind, so that a rank catching it learns what was wrong.
  view.team.share_root_failure(failure);
  std::vector<at::Tensor> tensors;  // each once: a tied tensor is listed under each of its names
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto& [name, tensor] : whole) {
    if (listed.insert(tensor.unsafeGetTensorImpl()).second) tensors.push_back(tensor);
  }
  view.team.broadcast_tensors(tensors);
  scatter_whole_state(view, whole);
}

void save_model_archive(StateSource source, const torch::nn::Module& module, const std::string& path) {
  PublicCallScope call("cpprun::save_full_state_dict");
  save_full_state(state_view(source), module, path);
}

void load_model_archive(StateSource source, const torch::nn::Module& module, const std::string& path) {
  PublicCallScope call("cpprun::load_full_state_dict");
  load_full_state(state_view(source), module, path);
}

}  // namespace cpprun::detail
