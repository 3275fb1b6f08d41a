// See optimizer_flat_state.h.
#include "checkpoint/optimizer_flat_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <set>
#include <utility>

#include "support/json.h"

namespace cpprun::detail {
namespace {

constexpr const char* kStatePrefix = "state.";
constexpr const char* kGroupsPrefix = "param_groups.";
constexpr int kFlatGroupsDepth = 4;  // [{"params": [...], "betas": [...]}]

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

c10::IValue value_of(const Json& json, const std::string& what) {
  switch (json.kind) {
    case Json::Kind::kNumber: {
      const auto number = json_double(json);
      TORCH_CHECK(number, "cpprun: ", what, " is ", json.text, ", not a finite number");
      return *number;
    }
    case Json::Kind::kString:
      return json.text;
    case Json::Kind::kArray: {
      std::vector<c10::IValue> items;
      for (const auto& item : json.items) items.push_back(value_of(item, what));
      return c10::ivalue::Tuple::create(std::move(items));  // Python's tuple, as torch.optim keeps betas
    }
    case Json::Kind::kOther:
      if (json.text == "null") return c10::IValue();
      return json.text == "true";
    case Json::Kind::kObject:
      break;
  }
  TORCH_CHECK(false, "cpprun: ", what, " is a JSON object, not an option's value");
}

// `value` as JSON, appended to `out`; false when it is of no kind an option's value has.
bool append_json(std::string& out, const c10::IValue& value) {
  if (value.isNone()) {
    out += "null";
  } else if (value.isBool()) {
    out += value.toBool() ? "true" : "false";
  } else if (value.isDouble()) {
    out += json_number_text(value.toDouble());
  } else if (value.isInt()) {
    out += std::to_string(value.toInt());
  } else if (value.isString()) {
    append_json_string(out, value.toStringRef());
  } else if (value.isTensor() && value.toTensor().numel() == 1) {  // a tensor lr, as torch.optim allows
    out += json_number_text(value.toTensor().to(at::kDouble).item<double>());
  } else if (value.isTuple() || value.isList()) {
    const std::vector<c10::IValue> items =
        value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
    out += "[";
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      if (!append_json(out, items[i])) return false;
    }
    out += "]";
  } else {
    return false;
  }
  return true;
}

// One parameter's group options as the dict gives them: in its order, and by name.
struct NamedOptions {
  std::vector<std::pair<std::string, std::string>> ordered;  // option -> its JSON
  std::map<std::string, std::string> by_name;
};

std::string members_json(const NamedOptions& options) {
  std::string out;
  for (const auto& [option, json] : options.ordered) {
    out += ", ";
    append_json_string(out, option);
    out += ": " + json;
  }
  return out;
}

std::string group_json(const std::vector<std::string>& params, const NamedOptions& options) {
  std::string list;
  for (const auto& name : params) {
    if (!list.empty()) list += ", ";
    append_json_string(list, name);
  }
  return "{\"params\": [" + list + "]" + members_json(options) + "}";
}

// The first way `b`'s options differ from `a`'s, as "param_groups.B.lr is 0.1, param_groups.A.lr 0.2".
std::string difference(const std::string& a_name, const NamedOptions& a, const std::string& b_name,
                       const NamedOptions& b) {
  const std::string pa = std::string(kGroupsPrefix) + a_name + ".", pb = std::string(kGroupsPrefix) + b_name + ".";
  for (const auto& [option, json] : b.by_name) {
    const auto found = a.by_name.find(option);
    if (found == a.by_name.end()) return "\"" + pb + option + "\" is given, \"" + pa + option + "\" is not";
    if (found->second != json) return "\"" + pb + option + "\" is " + json + ", \"" + pa + option + "\" " + found->second;
  }
  for (const auto& [option, json] : a.by_name) {
    if (!b.by_name.count(option)) return "\"" + pa + option + "\" is given, \"" + pb + option + "\" is not";
  }
  return {};
}

// The optimizer the options are of, when they say: SGD's momentum, Adam's or AdamW's
// decoupled_weight_decay (torch.optim's groups have it since PyTorch 2.7).
std::string kind_of_options(const std::map<std::string, NamedOptions>& options_of, const std::string& ours) {
  for (const auto& [name, options] : options_of) {
    const auto& o = options.by_name;
    if (o.count("momentum") || o.count("nesterov") || o.count("dampening")) return "SGD";
    if (o.count("betas") || o.count("amsgrad")) {
      const auto decoupled = o.find("decoupled_weight_decay");
      if (decoupled != o.end() && decoupled->second == "true") return "AdamW";
      if (decoupled != o.end() && decoupled->second == "false") return "Adam";
      return ours == "SGD" ? "Adam" : ours;  // Adam's or AdamW's: the options cannot tell
    }
  }
  return ours;
}

}  // namespace

FlatOptimizerState flatten_optimizer_state(NamedTensors state, const std::string& param_groups_json) {
  FlatOptimizerState out;
  // Each parameter's states in torch.optim's order, "step" first (Adam's _init_group makes it
  // before the moments); a parameter's states are together in `state`.
  const auto parameter_of = [](const std::string& key) { return key.substr(0, key.rfind('.')); };
  for (std::size_t begin = 0, end; begin < state.size(); begin = end) {
    const std::string parameter = parameter_of(state[begin].first);
    for (end = begin; end < state.size() && parameter_of(state[end].first) == parameter;) ++end;
    const std::string step = parameter + ".step";
    for (std::size_t i = begin; i < end; ++i) {
      if (state[i].first == step) out.insert(state[i].first, std::move(state[i].second));
    }
    for (std::size_t i = begin; i < end; ++i) {
      if (state[i].first != step) out.insert(state[i].first, std::move(state[i].second));
    }
  }
  const Json groups = parse_json(param_groups_json, kFlatGroupsDepth);
  TORCH_CHECK(groups.kind == Json::Kind::kArray, "cpprun: an optimizer's param groups are not a JSON array");
  for (const auto& group : groups.items) {
    const Json* params = nullptr;
    for (const auto& [key, value] : group.members) {
      if (key == "params") params = &value;
    }
    TORCH_CHECK(params && params->kind == Json::Kind::kArray, "cpprun: an optimizer's param group has no \"params\"");
    for (const auto& name : params->items) {
      for (const auto& [key, value] : group.members) {
        if (key == "params") continue;
        const std::string flat_key = std::string(kGroupsPrefix) + name.text + "." + key;
        out.insert(flat_key, value_of(value, "\"" + flat_key + "\""));
      }
    }
  }
  return out;
}

UnflattenedOptimizerState unflatten_optimizer_state(const FlatOptimizerState& flat,
                                                    const std::vector<std::vector<std::string>>& group_names,
                                                    const std::map<std::string, std::string>& canonical,
                                                    const std::string& kind) {
  UnflattenedOptimizerState out;
  std::vector<std::string> named;                // the dict's parameter names with options, in its order
  std::map<std::string, NamedOptions> options_of;
  for (const auto& item : flat) {
    const std::string& key = item.key();
    const c10::IValue& value = item.value();
    if (starts_with(key, kStatePrefix)) {
      if (value.isTensor()) {
        out.tensors.emplace_back(key, value.toTensor());
      } else {
        out.faults.push_back("\"" + key + "\" is a " + value.tagKind() + ", not a tensor (every state is one)");
      }
      continue;
    }
    const std::size_t dot = key.rfind('.');
    const std::size_t prefix = std::string(kGroupsPrefix).size();
    if (!starts_with(key, kGroupsPrefix) || dot == std::string::npos || dot <= prefix) {
      out.faults.push_back("\"" + key + "\" is neither \"state.<parameter>.<state>\" nor "
                           "\"param_groups.<parameter>.<option>\"");
      continue;
    }
    const std::string name = key.substr(prefix, dot - prefix), option = key.substr(dot + 1);
    std::string json;
    if (!append_json(json, value)) {
      out.faults.push_back("\"" + key + "\" is a " + value.tagKind() +
                           ", not an option's value (a number, bool, None, string or a tuple of them)");
      continue;
    }
    auto [options, fresh] = options_of.try_emplace(name);
    if (fresh) named.push_back(name);
    options->second.ordered.emplace_back(option, json);
    options->second.by_name[option] = json;
  }
  // This optimizer's groups, each with the names the dict uses for its parameters.
  std::map<std::string, std::vector<std::string>> dict_names;  // a parameter's first name -> the dict's
  for (const auto& name : named) {
    const auto alias = canonical.find(name);
    dict_names[alias == canonical.end() ? name : alias->second].push_back(name);
  }
  std::set<std::string> placed;
  std::string groups;
  for (const auto& names : group_names) {
    std::vector<std::string> params;
    for (const auto& name : names) {
      const auto found = dict_names.find(name);
      if (found == dict_names.end()) continue;  // missing: the load's check says so
      for (const auto& dict_name : found->second) {
        if (!params.empty()) {
          const std::string why = difference(params.front(), options_of[params.front()], dict_name, options_of[dict_name]);
          if (!why.empty()) {
            out.faults.push_back(why + ", but the optimizer holds both parameters in one param group, which has "
                                 "one value of each option");
          }
        }
        params.push_back(dict_name);
        placed.insert(dict_name);
      }
    }
    static const NamedOptions kNone;
    groups += (groups.empty() ? "" : ", ") + group_json(params, params.empty() ? kNone : options_of[params.front()]);
  }
  // The names of no parameter of this optimizer: a group per option set, listed as unexpected.
  std::vector<std::pair<NamedOptions, std::vector<std::string>>> others;
  for (const auto& name : named) {
    if (placed.count(name)) continue;
    const NamedOptions& options = options_of[name];
    auto same = others.begin();
    while (same != others.end() && same->first.by_name != options.by_name) ++same;
    if (same == others.end()) same = others.insert(others.end(), {options, {}});
    same->second.push_back(name);
  }
  for (const auto& [options, params] : others) groups += (groups.empty() ? "" : ", ") + group_json(params, options);
  out.param_groups_json = "[" + groups + "]";
  out.kind = kind_of_options(options_of, kind);
  return out;
}

}  // namespace cpprun::detail
