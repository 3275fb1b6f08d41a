// An optimizer's state in the flattened form of PyTorch's get_optimizer_state_dict(...,
// StateDictOptions(flatten_optimizer_state_dict=True)) ("state.<name>.<what>" tensors,
// "param_groups.<name>.<option>" values), to and from what an optimizer's file holds (the same
// tensors, and the groups as JSON: checkpoint/optimizer_state_dict.h), so that the in-memory
// get and set go through the code that saves and loads files.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/ordered_dict.h>

#include <map>
#include <string>
#include <vector>

#include "support/torch_save_file.h"

namespace cpprun::detail {

// cpprun::OptimizerStateDict (cpprun/optimizer_state_dict.h).
using FlatOptimizerState = torch::OrderedDict<std::string, c10::IValue>;

// A save's tensors (moved, in their order), then each group's options under each of its parameters'
// names, in the groups' order: a JSON number a double, true/false a bool, null None, an array a
// tuple (betas), a string a string. `param_groups_json`: [{"params": [name, ...], "lr": ...}, ...],
// as optimizer_state_to_save and the files' __metadata__ hold it.
FlatOptimizerState flatten_optimizer_state(NamedTensors state, const std::string& param_groups_json);

// The reverse, for an optimizer whose groups hold `group_names` (each parameter's first name;
// `canonical` maps a tied parameter's other names to it), of kind `kind` ("AdamW"): the state
// tensors; the groups as JSON, each of this optimizer's groups holding those of its parameters
// the dict names (by the name the dict uses), with the options of the first (the others must
// agree, as PyTorch's set_optimizer_state_dict requires), then one group per option set of the
// names that are none of them (so that the load's check lists them as unexpected); the kind the
// options say (an SGD's momentum, Adam's or AdamW's decoupled_weight_decay), else `kind`; and what
// cannot be made into a file (a value of no JSON kind, a key of neither section).
struct UnflattenedOptimizerState {
  NamedTensors tensors;
  std::string param_groups_json;
  std::string kind;
  std::vector<std::string> faults;
};
UnflattenedOptimizerState unflatten_optimizer_state(const FlatOptimizerState& flat,
                                                    const std::vector<std::vector<std::string>>& group_names,
                                                    const std::map<std::string, std::string>& canonical,
                                                    const std::string& kind);

}  // namespace cpprun::detail
