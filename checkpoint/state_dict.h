// State dicts by name (cpprun/state_dict.h): a module's parameters and buffers under PyTorch's
// state_dict() names, as .safetensors or .pt (torch.save's dict) by the file's extension, or a
// directory in Hugging Face's sharded layout (checkpoint/sharded_state_dict.h); the comparison that
// strict loading decides on; and the collective save and load of whole tensors over a team.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>

#include "checkpoint/checkpoint_team.h"
#include "cpprun/state_dict_options.h"
#include "support/safetensors.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// The module's parameters and buffers by name ("0.weight", "1.running_mean") in Python's
// state_dict() order: each module's own parameters, its own buffers, then its children's (Note
// [State dict order]); a tied tensor under each of its names, as Python's state_dict() lists it.
NamedTensors module_state(torch::nn::Module& module);

// What differs between the module's tensors and the file's (names, shapes, dtypes).
StateDictLoadReport compare_state(const NamedTensors& module, const NamedTensors& file);
// Throws StateDictMismatchError when the file holds two names the module ties to one tensor with
// different bytes (either would silently win); `where` names the file. load_named_tensors calls it;
// a reader that agrees on failures before loading calls it first, inside that agreement.
// `same` (null: the bytes compared) tells whether the file's tensors under two tied names (the
// module's names) hold the same values, for a file whose tensors are described, not held.
using SameTiedValues = std::function<bool(const std::string& first_name, const at::Tensor& first,
                                          const std::string& name, const at::Tensor& tensor)>;
void refuse_disagreeing_ties(const NamedTensors& module, const NamedTensors& file, const std::string& where,
                             const SameTiedValues& same = nullptr);
// The StateDictMismatchError refuse_disagreeing_ties throws for the file's `first` and `second` names,
// for a reader that compares tied names' values itself (pipeline stages on several ranks).
[[noreturn]] void throw_disagreeing_ties(const std::string& where, const std::string& first, const std::string& second);

// The file's bytes for `tensors`, in the format PATH's extension names (.safetensors, .pt, .pth).
std::string encode_state_dict(const NamedTensors& tensors, const std::string& path);
// The tensors in a file's bytes (CPU), by PATH's extension.
NamedTensors decode_state_dict(std::string_view bytes, const std::string& path);
// safetensors bytes for `tensors`, with `metadata` (plus "format": "pt" and the CRC) in the header.
std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata);
// Writes that file to PATH atomically (cpprun/atomic_file.h) from the tensors' own memory (a CPU
// copy of one that is elsewhere), never the whole file in one buffer: a save holds no second copy
// of the tensors it writes.
void write_safetensors_file(const std::string& path, const NamedTensors& tensors,
                            std::map<std::string, std::string> metadata);
// The layout of that file from the tensors' dtypes and shapes alone (meta tensors serve), for a
// file whose data is written in place (checkpoint/rows_in_place.h): the same header bytes.
SafetensorsLayout safetensors_layout_of(const NamedTensors& tensors, std::map<std::string, std::string> metadata);
// LibTorch's type for a tensor of a safetensors file PATH (CorruptCheckpointError for a dtype it
// has none for).
at::ScalarType safetensors_scalar_type(const SafetensorsTensor& entry, const std::string& path);
// The tensors of a parsed safetensors file, copied out (CPU); `path` names it in errors.
NamedTensors decode_safetensors(const SafetensorsFile& file, const std::string& path);
// PATH's bytes; a system_error naming it when it cannot be read.
std::string read_state_dict_bytes(const std::string& path);
// The tensors of the file PATH (.safetensors, or .pt: ours checked by its footer, torch.save's as
// it is), CPU; an error naming it when it cannot be read or parsed.
NamedTensors read_state_dict_file(const std::string& path);

// A strict(false) load's tensors left as they were because their dtype or shape differs, said on
// stderr when `first` (the team's first rank; of a plain module, the job's rank 0): PyTorch's
// load_state_dict(strict=False) casts another dtype (and refuses another shape), so a bf16 file
// loaded into a float32 model would otherwise leave its initial weights with only the report to
// tell. `where`: the file or dict.
void warn_left_as_they_were(const StateDictLoadReport& report, const std::string& where, bool first);

// The two halves of load_named_tensors, for a load whose ranks must agree between them (each
// rank checks its own source, then all copy or none): the check throws StateDictMismatchError
// (strict) or for disagreeing ties and changes nothing; the copy writes what fits.
StateDictLoadReport check_named_tensors(const NamedTensors& mine, const NamedTensors& file, const std::string& where,
                                        const StateDictOptions& options,
                                        const std::map<std::string, std::string>& file_of = {},
                                        const SameTiedValues& same = nullptr);
void copy_named_tensors(const NamedTensors& mine, const NamedTensors& file, const StateDictOptions& options);

// Loads `file` into `mine` (a module's state, or FSDP's gathered fp32 masters) in place, by
// name: what strict loading decides and does. `where` names the source in the error; `file_of`
// (a directory's tensors -> their files) adds each unexpected or mismatched tensor's file to it.
// Throws StateDictMismatchError, changing nothing.
StateDictLoadReport load_named_tensors(const NamedTensors& mine, const NamedTensors& file, const std::string& where,
                                       const StateDictOptions& options,
                                       const std::map<std::string, std::string>& file_of = {});

// The message of the StateDictMismatchError a strict load of PATH throws for `report`.
std::string mismatch_message(const StateDictLoadReport& report, const std::string& path,
                             const std::map<std::string, std::string>& file_of = {});
// The prefix that, put before or taken from the file's names, would make them the module's
// (Note [A prefix all names share]); empty when there is none.
struct PrefixFix {
  std::string prefix;
  bool file_has_it = false;  // true: consume_prefix_in_state_dict_if_present; false: file_key_prefix
};
PrefixFix prefix_fix(const StateDictLoadReport& report);
// A file's name as the module's under `options` (consume_prefix_in_state_dict_if_present, then
// file_key_prefix), and whether they rename at all.
std::string as_module_name(const std::string& file_name, const StateDictOptions& options);
bool renames_file_keys(const StateDictOptions& options);
// A report as bytes (for broadcast_bytes), and back.
std::string encode_report(const StateDictLoadReport& report);
StateDictLoadReport decode_report(const std::string& bytes);
// A report on one line for a message: "missing [a, b], unexpected [], mismatched [...]", each list
// its first 50 names, then how many more.
std::string describe_report(const StateDictLoadReport& report);

// Writes `state` to the file PATH atomically, in the format its extension names (not a directory);
// `metadata` goes into a .safetensors header beside the step and save id (an optimizer's kind).
void write_state_dict_file(const NamedTensors& state, const std::string& path, const StateDictSaveOptions& options,
                           std::map<std::string, std::string> metadata = {});
// Throws the error a save to PATH would for a name whose format cannot be told (or, for a
// directory, a path naming its index file), before any work.
void check_state_dict_path(const std::string& path);
// Reads PATH (a file, or a directory in the sharded layout) into `into`'s tensors in place.
StateDictLoadReport load_state_dict_file(const NamedTensors& into, const std::string& path,
                                         const StateDictOptions& options);

// `state`: whole tensors, the same on every rank of `team`. The team's root writes a file; to a
// directory every writer writes its share and the root the index last; a failure on any rank is
// raised on every rank. Alone: this process writes.
void save_state_dict(const NamedTensors& state, const CheckpointTeam& team, const std::string& path,
                     const StateDictSaveOptions& options);
// `into`: whole tensors of the same names and shapes on every rank; the root reads PATH into them
// in place (strict: a difference changes nothing and throws StateDictMismatchError), then they
// are broadcast; every rank returns the root's report or throws its error.
StateDictLoadReport load_state_dict(const NamedTensors& into, const CheckpointTeam& team, const std::string& path,
                                    const StateDictOptions& options);
// The same with the root's load given: it fills `into` in place or throws; the others wait.
StateDictLoadReport load_on_root_and_broadcast(const NamedTensors& into, const CheckpointTeam& team,
                                               const std::function<StateDictLoadReport()>& load_on_root);

}  // namespace cpprun::detail
