// An optimizer's state by parameter name, beside a model's state dict (cpprun/state_dict.h), in
// the form PyTorch's torch.distributed.checkpoint.state_dict.get_optimizer_state_dict gives with
// StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True): tensors
// "state.<param name>.<state>" ("state.fc1.weight.exp_avg"; "state.fc1.weight.step", a 0-d
// float32), each the whole parameter's shape whatever the wrapper, as safetensors; the param
// groups' options (lr, betas, eps, weight_decay, amsgrad, momentum, ...) as JSON in the files'
// __metadata__ "cpprun_param_groups" ([{"params": [name, ...], "lr": ...}], Python's
// optimizer.state_dict()["param_groups"] with names for ids), and "cpprun_optimizer" ("AdamW").
// SGD, Adam and AdamW; a plain module, DDP, FSDP (any stage, HSDP: the rows gathered).
// In memory, the same flattened dict: get_optimizer_state_dict / set_optimizer_state_dict below.
//
//   cpprun::save_state_dict(model, opt, "run/ckpt/", cpprun::StateDictSaveOptions().step(step));  // both
//   cpprun::load_state_dict(model, opt, "run/ckpt/");                      // both; any world size, stage
//   auto options = cpprun::StateDictSaveOptions().step(step);              // or one at a time:
//   cpprun::save_state_dict(model, "run/ckpt/", options);                  // model-*.safetensors
//   cpprun::save_optimizer_state_dict(model, opt, "run/ckpt/", options);   // optimizer-*.safetensors
//   cpprun::load_optimizer_state_dict(model, opt, "run/ckpt/");
//   auto pending = cpprun::save_async(model, opt, "run/ckpt/", "run/ckpt/", options);  // both, in the background
//
// PATH: a .safetensors file, or a directory (a path ending in '/', or an existing one):
// optimizer-0000R-of-0000N.safetensors files (each rank writes one, in parallel) and
// optimizer.safetensors.index.json, in Hugging Face's sharded layout beside the model's files;
// a save of one never touches the other's files. Every file of a save records its save id and
// options.step(); loading refuses a directory mixing saves, or whose optimizer index differs in
// save id from the model's index beside it, naming the file. The model and the optimizer saved
// into one directory by two calls with the same options share one id, as one save: with no
// options.save_id() given, a save joins this process's last save into that directory when it has
// the same step (or neither has one) and did not write these files yet (the model saved again, or
// at another step, is a new save). options.save_id() given: that id. Strict: another optimizer
// kind, parameters missing or unexpected, a state tensor of the wrong shape, in one error
// (cpprun::StateDictMismatchError) listing every fault; nothing changed.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <map>
#include <string>
#include <type_traits>

#include "cpprun/detail/replaced_files.h"
#include "cpprun/state_dict.h"

namespace cpprun {

// An optimizer's state dict in memory, in the flattened form of PyTorch's
// get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=True,
// flatten_optimizer_state_dict=True)), key for key:
//   "state.<name>.<state>"          a tensor of the whole parameter's shape ("state.fc1.weight.exp_avg");
//                                   "state.<name>.step" a 0-d float32, as torch.optim.Adam keeps it
//   "param_groups.<name>.<option>"  its group's option, as Python's param_groups hold it: a double
//                                   (lr, eps, weight_decay, momentum, dampening), a bool (amsgrad,
//                                   nesterov, maximize, capturable, differentiable,
//                                   decoupled_weight_decay), None (foreach, fused), a tuple of two
//                                   doubles (betas)
// Why an OrderedDict of IValue and not a struct of tensors and options: the flattened dict is a
// flat Python dict of tensors and Python scalars, and IValue is LibTorch's own type for exactly
// those values (a double stays a double, a bool a bool, None None, betas a tuple, as
// torch::pickle_save hands them to Python), so the keys, their order and their values are
// PyTorch's with nothing to translate, and a dict from Python (torch.load of its pickle) is set
// as it is; a struct would fix the options to today's optimizers and still need PyTorch's keys.
using OptimizerStateDict = torch::OrderedDict<std::string, c10::IValue>;

namespace detail {
// checkpoint/checkpoint.cpp: the same code for every wrapper and for a module.
void save_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path,
                          const StateDictSaveOptions& options);
void load_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const std::string& path);
// Refuses, on every rank, a model's and an optimizer's paths whose save ids differ; collective.
void check_one_save(StateSource source, const std::string& model_path, const std::string& optimizer_path);
// A pair save's `files`: their names checked before anything is written, then written into DIR by
// the save's root (checkpoint/save_files.h); each collective.
void check_save_files(StateSource source, const std::map<std::string, std::string>& files);
void write_save_files(StateSource source, const std::string& dir, const std::map<std::string, std::string>& files);
AsyncSave save_model_and_optimizer_async(StateSource source, torch::optim::Optimizer& optimizer,
                                         const std::string& model_path, const std::string& optimizer_path,
                                         const StateDictSaveOptions& options);
// checkpoint/checkpoint.cpp: PATH as the directory of `call` (save_state_dict or load_state_dict
// of a model and its optimizer), ending in '/'. A save takes a path without the '/' as the
// directory it names, as dcp.save(checkpoint_id=...) does (created if need be); refused: an
// existing file, or a name ending in a file format's extension (.safetensors, .pt, .pth, .bin),
// which reads as a file meant. A load says when PATH does not exist.
std::string checkpoint_directory(const std::string& path, const char* call);
OptimizerStateDict get_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer,
                                       const StateDictOptions& options);
void set_optimizer_state(StateSource source, torch::optim::Optimizer& optimizer, const OptimizerStateDict& state,
                         const StateDictOptions& options);
}  // namespace detail

// Writes `optimizer`'s state for `model`'s parameters to PATH. A DataParallel wrapper:
// collective, every rank calls it (FSDP gathers each state tensor's rows); a module: this process.
template <typename Model>
void save_optimizer_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const std::string& path,
                               const StateDictSaveOptions& options = StateDictSaveOptions()) {
  detail::finish_previous_save();
  detail::save_optimizer_state(detail::state_source(model), optimizer, path, options);
}

// `optimizer`'s state for `model`'s parameters in memory (OptimizerStateDict above): PyTorch's
// get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
// flatten_optimizer_state_dict=True)). What save_optimizer_state_dict writes, by the same code (a
// save is this, then a write): FSDP's rows and tensor-parallel splits gathered, a tied parameter
// under its first name, a parameter never stepped without state. A tensor the optimizer holds
// whole (DDP, a plain module) is the optimizer's own, as Python's optimizer.state_dict() gives it
// (clone it to keep it past the next step); a gathered one is new memory, a whole copy on every
// rank unless options.cpu_offload(true): then only the first rank (rank 0 of the wrapper's group)
// gets the dict, its tensors on the CPU, each gathered, copied and let go in turn; the others get
// an empty dict, as PyTorch's. A wrapper: collective, every rank calls it.
//
//   auto state = cpprun::get_optimizer_state_dict(model, optimizer);  // every rank: the whole state
//   cpprun::set_optimizer_state_dict(fresh, fresh_optimizer, state);
//
// Unlike PyTorch, an optimizer that never stepped is not stepped here with zero gradients to make
// its state (PyTorch's _init_optim_state): the dict has its param groups and no state.
template <typename Model>
OptimizerStateDict get_optimizer_state_dict(Model&& model, torch::optim::Optimizer& optimizer,
                                            const StateDictOptions& options = StateDictOptions()) {
  return detail::get_optimizer_state(detail::state_source(model), optimizer, options);
}

// Replaces `optimizer`'s state and its param groups' options with `state`'s (each rank its part:
// FSDP its rows), by parameter name: PyTorch's set_optimizer_state_dict(model, optimizer, state,
// options=StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)). Checked as
// load_optimizer_state_dict checks a file, always strictly (options.strict() is for the model, as
// PyTorch's flattened set has no partial load): a parameter missing or one the model lacks, a
// state tensor of another shape, a state that is not floating point (a floating one is cast to
// the parameter's dtype, as torch.optim's load_state_dict casts it), another optimizer's state or
// options (SGD's into an Adam; decoupled_weight_decay saying Adam into an AdamW), an option
// torch.optim would refuse, two parameters of one group with different options: one
// StateDictMismatchError lists every fault, and nothing changes. The tensors may be on any device.
// A wrapper: collective; every rank passes the whole dict and the ranks agree before any changes
// (one rank's fault stops all, unchanged), or with options.broadcast_from_rank0(true) rank 0's dict
// alone is read (the others may pass an empty one) and sent to every rank, which all throw alike.
template <typename Model>
void set_optimizer_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const OptimizerStateDict& state,
                              const StateDictOptions& options = StateDictOptions()) {
  detail::set_optimizer_state(detail::state_source(model), optimizer, state, options);
}

// save_state_dict(model, MODEL_PATH) and save_optimizer_state_dict(model, optimizer,
// OPTIMIZER_PATH) as one asynchronous save (cpprun/async_save.h): returns once both states are
// copied to CPU memory (pinned for tensors on a GPU; for files FSDP gathers the parameters and
// each state tensor's rows first, on the calling thread; for a directory each rank copies its own
// rows and writes them into the files itself, as the synchronous saves do), then one background
// thread writes both; the optimizer may step at once. Every file of the save records one save id
// (options.save_id(), else rank 0's draw), so loading refuses a model and optimizer of different
// saves. The paths may be one directory (ending in '/': model-* and optimizer-* files side by
// side), or two files (model: .safetensors/.pt; optimizer: .safetensors).
//
//   auto pending = cpprun::save_async(model, optimizer, "run/ckpt/", "run/ckpt/",
//                                     cpprun::StateDictSaveOptions().step(step));
//   ... train on ...
//   pending.wait();  // both on disk (or what failed, raised)
//
// Why one call for both, as PyTorch DCP's async_save({"model": ..., "optimizer": ...}) takes one
// state dict: the model and its optimizer are one checkpoint, complete only when both are
// written, so one handle says when; and two separate asynchronous saves would run one after the
// other, since a save first waits for this process's previous one.
template <typename Model>
[[nodiscard]] AsyncSave save_async(Model&& model, torch::optim::Optimizer& optimizer, const std::string& model_path,
                                   const std::string& optimizer_path,
                                   const StateDictSaveOptions& options = StateDictSaveOptions()) {
  detail::finish_previous_save();
  return detail::save_model_and_optimizer_async(detail::state_source(model), optimizer, model_path, optimizer_path,
                                                options);
}

// Replaces `optimizer`'s state and its param groups' options with PATH's, by parameter name (as
// PyTorch's optimizer.load_state_dict); each rank takes its part (FSDP: its rows) at any world
// size. Collective on a wrapper: rank 0 reads, every rank throws alike.
template <typename Model>
void load_optimizer_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const std::string& path) {
  detail::load_optimizer_state(detail::state_source(model), optimizer, path);
}

// The model and its optimizer as one checkpoint in the directory DIR ("ckpt", "ckpt/": created
// if need be), as PyTorch DCP's save takes one state dict {"model": ..., "optimizer": ...} and
// its checkpoint_id: save_state_dict(model, DIR, options) then save_optimizer_state_dict(model,
// optimizer, DIR, options), under one save id (options.save_id(), else a new one). Collective on
// a wrapper, as those two. An existing file, or a name with a file's extension (.safetensors,
// .pt, .pth, .bin), is refused: save to files with the two calls. One save: when the optimizer's
// part fails (a full disk), the model's files of the checkpoint DIR held before come back too.
// `files` (name -> bytes): more files of the same save, e.g. a trainer's state {"trainer.json":
// its step, the data's position and the save id (give options.save_id(new_save_id()) to know it)},
// as DCP saves non-tensor entries of the state dict: written into DIR last, each atomically, by
// the save's root (rank 0 of the model's group; pass the same files on every rank: the others'
// are not read), and put back with the model's and optimizer's files when the save fails. Plain
// names only, none of the save's own (model.*, model-*, optimizer.*, optimizer-*, *.tmp, *.prev):
// refused on every rank before anything is written.
template <typename Model>
void save_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const std::string& dir,
                     const StateDictSaveOptions& options = StateDictSaveOptions(),
                     const std::map<std::string, std::string>& files = {}) {
  const std::string directory = detail::checkpoint_directory(dir, "save_state_dict");
  StateDictSaveOptions one = options;
  if (!one.save_id()) one.save_id(new_save_id());  // rank 0's counts: it is broadcast
  detail::check_save_files(detail::state_source(model), files);  // collective, even with none
  detail::ReplacedFiles together;  // every part, or none: Note [A failed save puts the previous files back]
  save_state_dict(model, directory, one);
  save_optimizer_state_dict(model, optimizer, directory, one);
  detail::write_save_files(detail::state_source(model), directory, files);  // collective, even with none
  together.done();
}

// The reverse: load_state_dict(model, DIR, options), then load_optimizer_state_dict(model,
// optimizer, DIR), after refusing, before either is loaded, a model and an optimizer of different
// saves (Note [A pair of files from one save]). Returns the model's report (options.strict(false)
// relaxes the model's load only: the optimizer's is strict).
template <typename Model>
StateDictLoadReport load_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const std::string& dir,
                                    const StateDictOptions& options = StateDictOptions()) {
  const std::string directory = detail::checkpoint_directory(dir, "load_state_dict");
  detail::check_one_save(detail::state_source(model), directory, directory);
  StateDictLoadReport report = load_state_dict(model, directory, options);
  load_optimizer_state_dict(model, optimizer, directory);
  return report;
}

// The model and its optimizer from the two paths they were saved to together (save_async(model,
// optimizer, model_path, optimizer_path), or the two synchronous saves under one
// options.save_id()): as load_state_dict(model, model_path, options), then
// load_optimizer_state_dict(model, optimizer, optimizer_path), after refusing, before either is
// loaded, two paths whose save ids differ (a save cut short between its two files leaves a new
// model beside the old optimizer; Note [A pair of files from one save]). Paths without a save id
// (a .pt model, files another tool wrote) cannot be told apart and load as they are.
template <typename Model>
StateDictLoadReport load_state_dict(Model&& model, torch::optim::Optimizer& optimizer, const std::string& model_path,
                                    const std::string& optimizer_path,
                                    const StateDictOptions& options = StateDictOptions()) {
  detail::check_one_save(detail::state_source(model), model_path, optimizer_path);
  StateDictLoadReport report = load_state_dict(model, model_path, options);
  load_optimizer_state_dict(model, optimizer, optimizer_path);
  return report;
}

}  // namespace cpprun
