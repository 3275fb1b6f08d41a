// Options and the result of cpprun::load_state_dict and of the in-memory get_model_state_dict /
// set_model_state_dict (cpprun/state_dict.h).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cpprun {

class StateDictOptions {
 public:
  // As PyTorch's load_state_dict(strict=True), the default: a file whose names, shapes or dtypes
  // differ from the module's is refused with one error listing every difference, and the module
  // is left unchanged. strict(false) loads the tensors that fit and reports the rest.
  StateDictOptions& strict(bool on) {
    strict_ = on;
    return *this;
  }
  bool strict() const { return strict_; }

  // The file's names are the module's without this prefix: each is read as PREFIX + name. Loads
  // a base model's file into a model that holds the base model under a submodule, as Hugging
  // Face's from_pretrained does with its base_model_prefix (a GPT2Model's "wte.weight" into a
  // GPT2LMHeadModel's "transformer.wte.weight"). Empty, the default: names as they are.
  StateDictOptions& file_key_prefix(std::string prefix) {
    file_key_prefix_ = std::move(prefix);
    return *this;
  }
  const std::string& file_key_prefix() const { return file_key_prefix_; }

  // The reverse: the file's names carry this prefix, the module's do not. It is removed from each
  // of the file's names that starts with it, as PyTorch's torch.nn.modules.utils.
  // consume_prefix_in_state_dict_if_present(state_dict, prefix) does to a dict before
  // load_state_dict: "module." for torch.save(ddp_model.state_dict()), "_orig_mod." for a
  // torch.compile'd model's. With file_key_prefix too, this prefix goes first, then that one is
  // put before. Empty, the default: names as they are.
  StateDictOptions& consume_prefix_in_state_dict_if_present(std::string prefix) {
    consumed_prefix_ = std::move(prefix);
    return *this;
  }
  const std::string& consume_prefix_in_state_dict_if_present() const { return consumed_prefix_; }

  // get_model_state_dict (cpprun/state_dict.h), as PyTorch's StateDictOptions(cpu_offload=True)
  // with full_state_dict: the tensors are copied to the CPU, and only the first rank (the rank
  // that writes files: rank 0 of a wrapper's group) gets them; the others get an empty dict. Each
  // is gathered, copied and let go in turn, so a rank's device holds one gathered tensor at a
  // time, and one process, not every one, holds a whole copy of the model. Off, the default: every
  // rank gets every tensor on the model's device.
  StateDictOptions& cpu_offload(bool on) {
    cpu_offload_ = on;
    return *this;
  }
  bool cpu_offload() const { return cpu_offload_; }

  // set_model_state_dict (cpprun/state_dict.h), as PyTorch's StateDictOptions(
  // broadcast_from_rank0=True): only the first rank's dict is read (the others may pass an empty
  // one), its values are broadcast. Off, the default: every rank passes the whole dict and loads
  // its own part of it. Loads from files always read on the first rank and broadcast.
  // The first rank, here and in cpu_offload: rank 0 of the wrapper's group and of each of its
  // tensor-parallel groups. In a job laid out from rank 0 (a mesh over the world) that is world
  // rank 0, PyTorch's; in a wrapper over a subgroup, the subgroup's rank 0, not the world's.
  StateDictOptions& broadcast_from_rank0(bool on) {
    broadcast_from_rank0_ = on;
    return *this;
  }
  bool broadcast_from_rank0() const { return broadcast_from_rank0_; }

 private:
  bool strict_ = true;
  std::string file_key_prefix_;
  std::string consumed_prefix_;
  bool cpu_offload_ = false;
  bool broadcast_from_rank0_ = false;
};

class StateDictSaveOptions {
 public:
  // The training step, recorded in every file's safetensors __metadata__ (and a sharded save's
  // index) as "cpprun_step"; not recorded when not given.
  StateDictSaveOptions& step(int64_t value) {
    step_ = value;
    return *this;
  }
  const std::optional<int64_t>& step() const { return step_; }

  // The save id every file of the save records as "cpprun_save_id" (rank 0's, on a wrapper). Not
  // given, a save into a directory takes the id of this process's last save there when it is the
  // other half of it (the model's after the optimizer's, or the reverse, at the same step or with
  // neither giving one), else rank 0 draws a random one: so a model and its optimizer saved into
  // one directory with the same options load together, and a load refuses an optimizer whose id
  // differs from the model's there. cpprun::new_save_id() draws one, to name a save yourself.
  StateDictSaveOptions& save_id(std::string id) {
    save_id_ = std::move(id);
    return *this;
  }
  const std::optional<std::string>& save_id() const { return save_id_; }

 private:
  std::optional<int64_t> step_;
  std::optional<std::string> save_id_;
};

// 32 random hex digits, for StateDictSaveOptions::save_id.
std::string new_save_id();

// What load_state_dict did not load (all empty after a strict load, which throws otherwise), as
// PyTorch's load_state_dict returns missing_keys and unexpected_keys.
struct StateDictLoadReport {
  std::vector<std::string> missing_keys;     // the module's names the file lacks
  std::vector<std::string> unexpected_keys;  // the file's names the module lacks
  // "name: file float32 [3, 4], module float32 [4, 4]", for each name both have whose shape or
  // dtype differs.
  std::vector<std::string> mismatched;
};

// A strict load_state_dict refused the file: it names the file and lists every difference.
class StateDictMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace cpprun
