// cpprun/pipeline_state_dict.h: this rank's stages describe their state as one view (each its
// wrapper's, or its module's with tensor-parallel splits), and the stages save and load as the
// owners of their names (checkpoint/owned_state.h) over the pipeline group. A weight tied across
// ranks' stages (a head tied to the embedding) is in the model's checkpoint under each name, as
// the unsplit model's state_dict() lists it, and its optimizer state once, under the first
// stage's name, as the unsplit model's optimizer has it. save_async does the same on a background
// thread (checkpoint/owned_state.h's save_owned_state_async).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/async_optimizer_save.h"
#include "checkpoint/async_save.h"
#include "checkpoint/optimizer_state_dict.h"
#include "checkpoint/owned_state.h"
#include "checkpoint/save_files.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/state_view.h"
#include "checkpoint/writer_gather.h"
#include "comm/public_call.h"
#include "cpprun/detail/replaced_files.h"
#include "core/failure_agreement.h"
#include "cpprun/object_collectives.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/pipeline_state_dict.h"
#include "cpprun/point_to_point.h"
#include "cpprun/state_dict.h"
#include "pipeline/stage_access.h"
#include "pipeline/stage_names.h"
#include "pipeline/stage_wrapper.h"

namespace cpprun {
namespace {

void check_stages(const std::vector<PipelineStage*>& stages, const char* call) {
  TORCH_CHECK(!stages.empty(), "cpprun::", call, ": no pipeline stage given; pass every stage this rank holds.");
  std::set<int> indices;
  for (const PipelineStage* stage : stages) {
    TORCH_CHECK(stage != nullptr, "cpprun::", call, ": a null stage.");
    TORCH_CHECK(stage->group().rank() == stages[0]->group().rank() &&
                    stage->group().size() == stages[0]->group().size(),
                "cpprun::", call, ": the stages come from different pipeline groups.");
    TORCH_CHECK(indices.insert(stage->index()).second, "cpprun::", call, ": stage ", stage->index(),
                " is given twice.");
  }
  const PipelineStage& first = *stages[0];
  for (const PipelineStage* stage : stages) {
    TORCH_CHECK(stage->state_dict_prefixes() == first.state_dict_prefixes(), "cpprun::", call, ": stages ",
                first.index(), " and ", stage->index(), " of this rank were given different "
                "set_state_dict_prefixes; give every stage the same list.");
  }
  TORCH_CHECK(static_cast<int>(stages.size()) * first.group().size() == first.num_stages(), "cpprun::", call,
              ": this rank holds ", first.num_stages() / first.group().size(), " of the split's ", first.num_stages(),
              " stages, but ", stages.size(), " were given; pass every stage this rank holds, so that the "
              "checkpoint is the whole model's.");
}

// One stage's view, its team over the tensor-parallel group it was told too.
detail::StateView stage_view(const PipelineStage& stage) {
  detail::StateSource source;
  source.wrapper = detail::data_parallel_core(stage);
  if (!source.wrapper) source.module = stage.module().ptr().get();
  detail::StateView view = detail::state_view(source);
  if (const auto& tp = stage.tensor_parallel_group()) view.team = view.team.also_over(*tp);
  return view;
}

// One view of this rank's stages: their entries in order, a tensor two of them share (a tie
// within the rank) once, under each name.
detail::StateView merged_view(const std::vector<PipelineStage*>& stages, const char* call) {
  auto views = std::make_shared<std::vector<detail::StateView>>();
  for (const PipelineStage* stage : stages) {
    views->push_back(stage_view(*stage));
    const auto& team = views->back().team;
    const auto& first_team = views->front().team;
    TORCH_CHECK(team.writes() == first_team.writes() && team.writer_rank() == first_team.writer_rank() &&
                    team.writers() == first_team.writers(),
                "cpprun::", call, ": stages ", stages[0]->index(), " and ", stage->index(),
                " of this rank are wrapped over different groups; wrap a rank's stages alike.");
  }
  // The checkpoint's names: the Sequential's, or under the stages' prefixes the model's whose
  // modules it holds (set_state_dict_prefixes).
  const detail::NamePrefixes& prefixes = stages[0]->state_dict_prefixes();
  detail::StateView merged;
  merged.team = views->front().team;
  std::unordered_map<const c10::TensorImpl*, std::size_t> entry_of;
  // Parameters first, then buffers, as a view lists them.
  for (const bool parameters : {true, false}) {
    for (const auto& view : *views) {
      for (const auto& entry : view.entries) {
        if (entry.parameter != parameters) continue;
        if (entry_of.emplace(entry.local.unsafeGetTensorImpl(), merged.entries.size()).second) {
          merged.entries.push_back(entry);
          merged.entries.back().name = detail::renamed(prefixes, entry.name);
        }
      }
    }
  }
  std::map<std::string, std::pair<std::size_t, std::string>> named;  // checkpoint name -> (entry, module name)
  for (std::size_t v = 0; v < views->size(); ++v) {
    for (const auto& [name, index] : (*views)[v].names) {
      const std::size_t entry = entry_of.at((*views)[v].entries[index].local.unsafeGetTensorImpl());
      const std::string saved_as = detail::renamed(prefixes, name);
      const auto [before, fresh] = named.try_emplace(saved_as, entry, name);
      if (!fresh) {
        TORCH_CHECK(before->second.first == entry, "cpprun::", call, ": \"", before->second.second, "\" and \"",
                    name, "\" (stage ", stages[v]->index(), ") would both be saved as \"", saved_as,
                    "\" under set_state_dict_prefixes; give them prefixes that keep their names apart.");
        continue;  // one tensor under one name twice (two stages' names for it, renamed alike): once
      }
      merged.names.emplace_back(saved_as, entry);
    }
  }
  merged.after_load = [views] {
    for (const auto& view : *views) {
      if (view.after_load) view.after_load();
    }
  };
  return merged;
}

// Note [One checkpoint call on every pipeline rank]
// A stages' save or load is collective over the pipeline group, and each rank's part of it (its
// checks of the stages, the path it writes or reads) is its own. A mistake on one rank was refused
// on that rank alone, the others left waiting in the next collective until the group's timeout (a
// rank given one of its two stages); ranks given different paths each read their own (a model
// made of two saves), or took a file and a directory and waited for each other; a prefix list on
// some ranks only wrote an index of prefixed and plain names. So every rank runs its own checks,
// then all-gathers their outcome with what it was given (the paths, each as a file or directory,
// and set_state_dict_prefixes): a rank's refusal is every rank's, and a difference is refused on
// every rank, naming both ranks and what each was given, before anything is read or written.

// Note [Agreement across pipelines]
// With data-parallel replicas of the pipeline ({pp, dp}) or tensor-parallel stages ({pp, tp}), a
// save's collectives run over the stages' data- and tensor-parallel groups too, which the
// pipeline group does not reach: a mistake one pipeline made was refused on its ranks while the
// other pipelines' waited for them there until the timeout, and two pipelines given two paths
// each wrote their own. So the agreement goes on over the first stage's team (its data-parallel
// group, then each tensor-parallel group), the same exchange over each, a refusal heard carried
// on: rank (d, s, t) agrees with (d, *, t) over the pipeline, with (*, s, t) over the
// data-parallel group, then with (d, s, *) over the tensor-parallel one, which reaches every rank.
// Then once more over the pipeline group: a stage whose team lacks a group the other stages' have
// (a {pp, tp} stage not told its tensor-parallel group, which a later check refuses by name) took
// no part in that group's agreement, and would go on alone into the save's collectives.

// What a rank was given, to compare: each path (as written, lexically normal, without a trailing
// '/') and whether the save or load takes it as a directory, then the stages' prefixes.
struct GivenCall {
  std::vector<std::string> paths;
  std::string prefixes;
  std::string encode() const {
    std::string out = prefixes + '\x01';
    for (const auto& path : paths) out += path + '\0';
    return out;
  }
  static GivenCall decode(const std::string& bytes) {
    GivenCall out;
    const std::size_t end = bytes.find('\x01');
    out.prefixes = bytes.substr(0, end);
    for (std::size_t at = end + 1; at < bytes.size();) {
      const std::size_t next = bytes.find('\0', at);
      out.paths.push_back(bytes.substr(at, next - at));
      at = next + 1;
    }
    return out;
  }
};

std::string path_as_given(const std::string& path) {
  std::string normal = std::filesystem::path(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return "\"" + normal + "\" (" + (detail::is_sharded_state_dict_path(path) ? "a directory" : "a file") + ")";
}

std::string prefixes_text(const std::vector<std::pair<std::string, std::string>>& prefixes) {
  if (prefixes.empty()) return "none";
  std::string out = "{";
  for (const auto& [from, to] : prefixes) out += (out.size() > 1 ? ", {\"" : "{\"") + from + "\", \"" + to + "\"}";
  return out + "}";
}

// Collective over `group` (the pipeline group, or a group of the stages' team: `kind` names it,
// "pipeline", "data-parallel" or "tensor-parallel"): `local` this rank's refusal (or null), `given`
// what it was given. Throws this rank's refusal, else another rank's (its kind and message, naming
// that rank), else a difference in what the ranks were given; returns when they agree.
void agree_on_call(const ProcessGroup& group, const std::string& kind, std::exception_ptr local,
                   const GivenCall& given, const char* call) {
  const auto all = all_gather_bytes(group, local ? "F" + detail::describe_failure(local) : "A" + given.encode());
  if (local) std::rethrow_exception(local);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] != 'F') continue;
    detail::throw_failure_of(all[r].substr(1), static_cast<int>(r), std::string("cpprun::") + call);
  }
  const int me = group.rank();
  const std::string ranks = kind == "pipeline" ? "the pipeline's ranks" : "the " + kind + " group's ranks";
  const GivenCall first = GivenCall::decode(all[0].substr(1));
  for (std::size_t r = 1; r < all.size(); ++r) {
    const GivenCall theirs = GivenCall::decode(all[r].substr(1));
    for (std::size_t k = 0; k < first.paths.size() && k < theirs.paths.size(); ++k) {
      TORCH_CHECK(first.paths[k] == theirs.paths[k], "cpprun::", call, ": ", ranks, " were given different ",
                  "checkpoints: ", kind, " rank 0 ", first.paths[k], ", rank ", r, " ", theirs.paths[k], "; every ",
                  "rank passes the same path, the one checkpoint of the whole model (found on ", kind, " rank ", me,
                  ").");
    }
    TORCH_CHECK(first.prefixes == theirs.prefixes, "cpprun::", call, ": ", ranks, "' stages were given different "
                "set_state_dict_prefixes: ", kind, " rank 0 ", first.prefixes, ", rank ", r, " ", theirs.prefixes,
                "; give every stage of every rank the same list, so that the checkpoint's names are one model's "
                "(found on ", kind, " rank ", me, ").");
  }
}

// This rank's stages as one view, agreed over the pipeline group with the other ranks' (Note [One
// checkpoint call on every pipeline rank]). `check_paths` (may be null) is the call's own check of
// its paths, refused on every rank alike.
detail::StateView stages_view(const std::vector<PipelineStage*>& stages, const char* call,
                              const std::vector<std::string>& paths, const std::function<void()>& check_paths = {}) {
  const auto any = std::find_if(stages.begin(), stages.end(), [](const PipelineStage* s) { return s != nullptr; });
  // No stage: no pipeline group to tell the other ranks over.
  TORCH_CHECK(any != stages.end(), "cpprun::", call, ": no pipeline stage given; pass every stage this rank holds.");
  std::exception_ptr fault;
  detail::StateView view;
  GivenCall given;
  detail::CheckpointTeam team;  // of the first stage: Note [Agreement across pipelines]
  try {
    team = stage_view(**any).team;
    if (check_paths) check_paths();
    check_stages(stages, call);
    for (const auto& path : paths) given.paths.push_back(path_as_given(path));
    given.prefixes = prefixes_text(stages[0]->state_dict_prefixes());
    // A mistake in names that only some ranks' stages make (two tensors under one name) too.
    view = merged_view(stages, call);
  } catch (...) {
    fault = std::current_exception();
  }
  try {
    agree_on_call((*any)->group(), "pipeline", fault, given, call);
  } catch (...) {
    fault = std::current_exception();
  }
  const auto team_groups = team.groups();
  for (std::size_t g = 0; g < team_groups.size(); ++g) {
    // The data-parallel group first, when the team has one (CheckpointTeam::groups).
    const bool data_parallel = g == 0 && team.replicas() != nullptr;
    try {
      agree_on_call(*team_groups[g], data_parallel ? "data-parallel" : "tensor-parallel", fault, given, call);
    } catch (...) {
      fault = std::current_exception();
    }
  }
  detail::share_failure((*any)->group(), fault, std::string("cpprun::") + call);
  return view;
}

// A step of a save only some ranks can fail before its next collective (an optimizer over another
// model's parameters): every rank of the job throws the failing rank's error (Note [One checkpoint
// call on every pipeline rank], Note [Agreement across pipelines]).
template <typename Step>
auto refused_together(const ProcessGroup& pipeline, const detail::CheckpointTeam& team, const char* call, Step step)
    -> decltype(step()) {
  std::exception_ptr fault;
  decltype(step()) out;
  try {
    out = step();
  } catch (...) {
    fault = std::current_exception();
  }
  const std::string what = std::string("cpprun::") + call;
  try {
    detail::share_failure(pipeline, fault, what);
  } catch (...) {
    fault = std::current_exception();
  }
  try {
    team.share_failure(fault, what);
  } catch (...) {
    fault = std::current_exception();
  }
  detail::share_failure(pipeline, fault, what);  // Note [Agreement across pipelines]: once more
  return out;
}

}  // namespace

namespace {

// The optimizer's view of this rank's stages. A weight tied to a stage on another rank (GPT's
// head, tied to the first stage's embedding) is saved by the rank of the tie's first stage, under
// that stage's name, and loaded here from that name: as the unsplit model's optimizer holds it
// once, its copies being equal after every step's tie sum.
detail::OptimizerParams stages_optimizer_params(const std::vector<PipelineStage*>& stages,
                                                const detail::StateView& view) {
  detail::OptimizerParams params = detail::optimizer_params(view);
  std::set<int> mine;
  for (const PipelineStage* stage : stages) mine.insert(stage->index());
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < params.names.size(); ++i) index_of[params.names[i]] = i;
  // The ties' names are the Sequential's; every rank's stages have the same prefixes.
  const detail::NamePrefixes& prefixes = stages[0]->state_dict_prefixes();
  for (const auto& tie : detail::StageAccess::ties(*stages[0]).ties) {
    if (mine.count(tie.stages.front())) continue;  // this rank saves it
    for (std::size_t k = 1; k < tie.stages.size(); ++k) {
      const std::string name = detail::renamed(prefixes, tie.names[k]);
      const auto found = index_of.find(name);
      if (!mine.count(tie.stages[k]) || found == index_of.end()) continue;
      params.saved_by_another.insert(name);
      params.aliases[detail::renamed(prefixes, tie.names.front())] = found->second;
    }
  }
  return params;
}

// The stages' optimizer state as a save to PATH writes it: for a directory, each tensor gathered
// to its writer alone (checkpoint/writer_gather.h), as the model's; for a file, whole on every rank.
detail::OptimizerStateToSave optimizer_state_for(const std::vector<PipelineStage*>& stages,
                                                 const detail::StateView& view, torch::optim::Optimizer& optimizer,
                                                 const std::string& path, detail::WholeTensors hold) {
  if (!detail::is_sharded_state_dict_path(path)) {
    return detail::optimizer_state_to_save(stages_optimizer_params(stages, view), optimizer);
  }
  return detail::optimizer_state_to_save(stages_optimizer_params(stages, view), optimizer, nullptr, &view.team,
                                         "saving the optimizer state to " + path, hold);
}

}  // namespace

void save_state_dict(std::vector<PipelineStage*> stages, const std::string& path, const StateDictSaveOptions& options) {
  detail::PublicCallScope call("cpprun::save_state_dict (pipeline stages)");
  detail::finish_previous_save();
  const detail::StateView view =
      stages_view(stages, "save_state_dict", {path}, [&] { detail::check_state_dict_path(path); });
  at::NoGradGuard no_grad;
  // A directory: each tensor gathered to its writer alone (Note [Gathering to the writer]); every
  // owner's team plans its own files as one team's save would, only numbered after the others'.
  detail::save_owned_state(detail::state_to_save(view, path, detail::WholeTensors::kMayShare), view.team,
                           stages[0]->group(), path, options);
}

namespace {

// Note [A tie the checkpoint holds under one name]
// The unsplit model's tied weight is one tensor under two names; a checkpoint may hold it under one
// (Hugging Face's GPT-2 files hold transformer.wte.weight, not lm_head.weight). Loading that into
// the unsplit model (strict(false)) fills both names, the tensor being one, though the report says
// the other is missing. Stages on different ranks hold copies of a tie, so the copy whose name the
// checkpoint lacks is filled from the first stage whose copy it held, rank to rank in each pipeline
// group (every rank has the loaded whole tensors by then), and the report stays the unsplit model's.
constexpr int kTieCopyTag = 1;

void fill_ties_held_once(const std::vector<PipelineStage*>& stages, const detail::NamedTensors& whole,
                         const StateDictLoadReport& report) {
  // Not loaded: what the checkpoint lacks, and (strict(false)) what it holds in another dtype or
  // shape, left as it was: a tie's copy either way takes the value of a copy that loaded, as the
  // unsplit model's one tensor does (its copies would otherwise stay apart for good).
  std::set<std::string> missing(report.missing_keys.begin(), report.missing_keys.end());
  for (const std::string& line : report.mismatched) missing.insert(line.substr(0, line.find(": file ")));
  if (missing.empty()) return;
  const detail::NamePrefixes& prefixes = stages[0]->state_dict_prefixes();
  const ProcessGroup& pipeline = stages[0]->group();
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, tensor] : whole) mine.emplace(name, tensor);
  const auto rank_of = [&](int stage) { return stage % pipeline.size(); };
  for (const auto& tie : detail::StageAccess::ties(*stages[0]).ties) {
    std::vector<std::string> names;
    for (const auto& name : tie.names) names.push_back(detail::renamed(prefixes, name));
    const auto held = std::find_if(names.begin(), names.end(), [&](const auto& n) { return !missing.count(n); });
    if (held == names.end()) continue;  // the checkpoint holds none of its names
    const std::size_t source = static_cast<std::size_t>(held - names.begin());
    const int from = rank_of(tie.stages[source]);
    for (std::size_t k = 0; k < names.size(); ++k) {
      const int to = rank_of(tie.stages[k]);
      if (!missing.count(names[k]) || to == from) continue;  // held, or the same tensor on one rank
      if (pipeline.rank() == from) send(pipeline, mine.at(names[source]).contiguous(), to, kTieCopyTag);
      if (pipeline.rank() == to) {
        at::Tensor& copy = mine.at(names[k]);
        at::Tensor received = at::empty_like(copy, at::MemoryFormat::Contiguous);
        recv(pipeline, received, from, kTieCopyTag);
        copy.copy_(received);
      }
    }
  }
}

}  // namespace

StateDictLoadReport load_state_dict(std::vector<PipelineStage*> stages, const std::string& path,
                                    const StateDictOptions& options) {
  detail::PublicCallScope call("cpprun::load_state_dict (pipeline stages)");
  const detail::StateView view = stages_view(stages, "load_state_dict", {path});
  at::NoGradGuard no_grad;
  // The current whole state: what the checkpoint's tensors replace in place (a replicated tensor
  // is the module's own), then cut back to each rank's part.
  const detail::NamedTensors whole = detail::whole_state(view);
  // A tie's copies on different ranks, by their checkpoint names: the file's values under them must
  // agree, as the unsplit model's one tensor demands (Note [Tied copies held by several owners]).
  std::vector<std::vector<std::string>> tied;
  for (const auto& tie : detail::StageAccess::ties(*stages[0]).ties) {
    tied.emplace_back();
    for (const auto& name : tie.names) tied.back().push_back(detail::renamed(stages[0]->state_dict_prefixes(), name));
  }
  StateDictLoadReport report =
      detail::load_owned_state(whole, view.team, stages[0]->group(), path, options, tied);
  fill_ties_held_once(stages, whole, report);  // See Note [A tie the checkpoint holds under one name]
  detail::scatter_whole_state(view, whole);
  detail::warn_left_as_they_were(report, path, view.team.is_root() && stages[0]->group().rank() == 0);
  return report;
}

void save_optimizer_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                               const std::string& path, const StateDictSaveOptions& options) {
  detail::PublicCallScope call("cpprun::save_optimizer_state_dict (stages)");
  detail::finish_previous_save();
  const detail::StateView view = stages_view(stages, "save_optimizer_state_dict", {path},
                                             [&] { detail::check_optimizer_path(path, "save_optimizer_state_dict"); });
  at::NoGradGuard no_grad;
  // An optimizer over another model's parameters is refused on every rank before the state's
  // first collective (FSDP's, over the data-parallel group), where the other pipelines waited.
  refused_together(stages[0]->group(), view.team, "save_optimizer_state_dict", [&] {
    detail::check_optimizer_params(stages_optimizer_params(stages, view), optimizer, "save_optimizer_state_dict");
    return 0;
  });
  detail::OptimizerStateToSave saved =
      optimizer_state_for(stages, view, optimizer, path, detail::WholeTensors::kMayShare);
  detail::merge_owned_param_groups(saved, stages[0]->group());
  detail::save_owned_state(saved.state, view.team, stages[0]->group(), path, options, detail::kOptimizerStem,
                           saved.metadata);
}

void load_optimizer_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                               const std::string& path) {
  detail::PublicCallScope call("cpprun::load_optimizer_state_dict (stages)");
  const detail::StateView view = stages_view(stages, "load_optimizer_state_dict", {path});
  at::NoGradGuard no_grad;
  const detail::OptimizerParams params = stages_optimizer_params(stages, view);
  // An optimizer over another model's parameters is refused on every rank before the load's
  // first collective, where the others waited out the timeout (a review, 2026-12-07).
  refused_together(stages[0]->group(), view.team, "load_optimizer_state_dict", [&] {
    detail::check_optimizer_params(params, optimizer, "load_optimizer_state_dict");
    return 0;
  });
  detail::load_optimizer_state_dict(params, optimizer, view.team, path, &stages[0]->group());
}

AsyncSave save_async(std::vector<PipelineStage*> stages, const std::string& path, const StateDictSaveOptions& options) {
  detail::PublicCallScope call("cpprun::save_async (pipeline stages)");
  detail::finish_previous_save();
  const detail::StateView view =
      stages_view(stages, "save_async", {path}, [&] { detail::check_state_dict_path(path); });
  at::NoGradGuard no_grad;
  std::vector<detail::AsyncSavePart> parts(1);
  parts[0].state = detail::state_to_save(view, path, detail::WholeTensors::kOwned);
  parts[0].path = path;
  parts[0].owned = detail::is_sharded_state_dict_path(path);
  return detail::save_owned_state_async(std::move(parts), view.team, stages[0]->group(), options);
}

AsyncSave save_async(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                     const std::string& model_path, const std::string& optimizer_path,
                     const StateDictSaveOptions& options) {
  detail::PublicCallScope call("cpprun::save_async (pipeline stages)");
  detail::finish_previous_save();
  const detail::StateView view = stages_view(stages, "save_async", {model_path, optimizer_path},
                                             [&] { detail::check_async_save_paths(model_path, optimizer_path); });
  at::NoGradGuard no_grad;
  std::vector<detail::AsyncSavePart> parts;
  parts.emplace_back();
  parts[0].state = detail::state_to_save(view, model_path, detail::WholeTensors::kOwned);
  parts[0].path = model_path;
  parts[0].owned = detail::is_sharded_state_dict_path(model_path);
  refused_together(stages[0]->group(), view.team, "save_async", [&] {
    detail::check_optimizer_params(stages_optimizer_params(stages, view), optimizer, "save_async");
    return 0;
  });
  detail::OptimizerStateToSave saved =
      optimizer_state_for(stages, view, optimizer, optimizer_path, detail::WholeTensors::kOwned);
  detail::merge_owned_param_groups(saved, stages[0]->group());
  parts.push_back(
      detail::optimizer_part(std::move(saved), optimizer_path, detail::is_sharded_state_dict_path(optimizer_path)));
  return detail::save_owned_state_async(std::move(parts), view.team, stages[0]->group(), options);
}

void save_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer, const std::string& dir,
                     const StateDictSaveOptions& options, const std::map<std::string, std::string>& files) {
  detail::PublicCallScope call("cpprun::save_state_dict (pipeline stages)");
  std::string directory;
  const detail::StateView view = stages_view(stages, "save_state_dict", {dir}, [&] {  // checks the stages first
    directory = detail::checkpoint_directory(dir, "save_state_dict");
  });
  StateDictSaveOptions one = options;
  if (!one.save_id()) one.save_id(new_save_id());  // pipeline rank 0's root's counts: it is broadcast
  detail::check_save_files(view.team, &stages[0]->group(), files);
  // Every part, or none (Note [A failed save puts the previous files back]): it was missing here,
  // so an optimizer's part that failed left the new model's files beside the earlier optimizer's.
  detail::ReplacedFiles together;
  save_state_dict(stages, directory, one);
  save_optimizer_state_dict(stages, optimizer, directory, one);
  detail::write_save_files(view.team, &stages[0]->group(), directory, files);
  together.done();
}

StateDictLoadReport load_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                                    const std::string& dir, const StateDictOptions& options) {
  detail::PublicCallScope call("cpprun::load_state_dict (pipeline stages)");
  // A model and an optimizer of two saves are refused before either is loaded (Note [A pair of
  // files from one save]): the optimizer's refusal used to come after the model's load.
  std::string directory;
  const detail::StateView view = stages_view(stages, "load_state_dict", {dir}, [&] {  // checks the stages first
    directory = detail::checkpoint_directory(dir, "load_state_dict");
  });
  detail::check_one_save(view.team, &stages[0]->group(), directory, directory);
  // The optimizer's parameters checked before the model is loaded (its refusal came after).
  refused_together(stages[0]->group(), view.team, "load_state_dict", [&] {
    detail::check_optimizer_params(stages_optimizer_params(stages, view), optimizer, "load_optimizer_state_dict");
    return 0;
  });
  StateDictLoadReport report = load_state_dict(stages, directory, options);
  load_optimizer_state_dict(std::move(stages), optimizer, directory);
  return report;
}

}  // namespace cpprun
