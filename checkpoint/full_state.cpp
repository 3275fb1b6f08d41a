// See full_state.h.
#include "checkpoint/full_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include "core/failure_agreement.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"

namespace cpprun::detail {
namespace {

// Reads `archive` into `module`'s tensors in place (Module::load would replace their storage,
// e.g. FSDP's unsharded memory).
void copy_in(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value);
    TORCH_CHECK(value.sizes() == item.value().sizes(), "cpprun: checkpoint tensor \"",
                item.key(), "\" has shape ", value.sizes(), " but the module's has ", item.value().sizes(), ".");
    item.value().copy_(value);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive sub;
    archive.read(child.key(), sub);
    copy_in(*child.value(), sub);
  }
}

}  // namespace

void broadcast_module_state(torch::nn::Module& module, const ProcessGroup& group) {
  std::vector<at::Tensor> state;
  for (const auto& p : module.parameters()) state.push_back(p);
  for (const auto& b : module.buffers()) state.push_back(b);
  broadcast_coalesced(group, state, 0);
}

void save_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path) {
  std::exception_ptr failure;
  if (group.rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      module.save(archive);
      save_checkpoint(archive, path);  // atomic, with a checksum; torch::load still reads it
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  agree_on_failure(group, failure, "saving the full state dict to " + path);
}

void load_full_state(torch::nn::Module& module, const ProcessGroup& group, const std::string& path) {
  std::exception_ptr failure;
  if (group.rank() == 0) {
    try {
      torch::serialize::InputArchive archive;
      // Our own files are checked; one torch::save wrote carries no checksum and is read as it is.
      load_checkpoint(archive, path, UncheckedFiles::kAccept);
      copy_in(module, archive);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Only rank 0 reads: the others must not wait for its broadcast if it could not.
  agree_on_failure(group, failure, "loading the full state dict from " + path);
  broadcast_module_state(module, group);
}

}  // namespace cpprun::detail
