// Options and the result of cpprun::load_state_dict (cpprun/state_dict.h).
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

 private:
  bool strict_ = true;
  std::string file_key_prefix_;
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
