// PipelineStage: one stage of a model cut by child names (checked by stage_split.h), and the
// gradient clipping that spans every stage.
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <set>
#include <unordered_set>

#include "comm/group_membership.h"
#include "core/clip_grad_norm.h"
#include "core/failure_agreement.h"
#include "core/deferred_replay.h"
#include "cpprun/deferred_init.h"
#include "cpprun/unique_parameters.h"
#include "cpprun/pipeline.h"
#include "cpprun/tensor_parallel_split.h"
#include "pipeline/stage_names.h"
#include "pipeline/stage_split.h"
#include "pipeline/stage_wrapper.h"
#include "pipeline/tied_parameters.h"

namespace cpprun {

namespace {

std::vector<std::string> child_names(const torch::nn::Sequential& model) {
  std::vector<std::string> names;
  for (const auto& child : model->named_children()) names.push_back(child.key());
  return names;
}

bool any_deferred(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (is_deferred(p)) return true;
  }
  for (const auto& b : module.buffers()) {
    if (is_deferred(b)) return true;
  }
  return false;
}

// Gives the stage's deferred tensors their memory and the values eager construction of the whole
// model gives them; the other stages' stay without memory. Their draws, earlier or later, are
// replayed on scratch memory so that this stage's start where eager construction's did.
void materialize_stage(const torch::nn::Module& model, const torch::nn::Module& stage) {
  std::vector<at::Tensor> mine, others;
  std::unordered_set<const c10::StorageImpl*> in_stage;
  for (const auto& t : stage.parameters()) mine.push_back(t);
  for (const auto& t : stage.buffers()) mine.push_back(t);
  for (const auto& t : mine) {
    if (t.has_storage()) in_stage.insert(t.storage().unsafeGetStorageImpl());
  }
  for (const auto& list : {model.parameters(), model.buffers()}) {
    for (const auto& t : list) {
      if (is_deferred(t) && !in_stage.count(t.storage().unsafeGetStorageImpl())) others.push_back(t);
    }
  }
  detail::DeferredReplay replay({mine, others}, /*every_group=*/false);
  replay.materialize(0);
}

}  // namespace

PipelineSplit split_evenly(const torch::nn::Sequential& model, int stages) {
  const auto names = child_names(model);
  PipelineSplit split;
  for (const auto& range : detail::even_ranges(static_cast<int>(names.size()), stages)) {
    split.emplace_back(names.begin() + range.first, names.begin() + range.first + range.count);
  }
  return split;
}

PipelineStage::PipelineStage(const torch::nn::Sequential& model, const PipelineSplit& split, ProcessGroup group,
                             int stage_index)
    : group_(detail::member_group("PipelineStage", std::move(group))), num_stages_(static_cast<int>(split.size())) {
  const auto names = child_names(model);
  TORCH_CHECK(static_cast<int>(names.size()) == static_cast<int>(model->size()),
              "PipelineStage: the model's children and its modules differ in number; build it as a plain "
              "torch::nn::Sequential.");
  const auto ranges = detail::check_split(names, split, group_.size());
  for (std::size_t s = 0; s < split.size(); ++s) {
    for (std::size_t c = 0; c < split[s].size(); ++c) split_text_ += (c ? "," : s ? "|" : "") + split[s][c];
  }
  TORCH_CHECK(stage_index >= -1, "PipelineStage: stage_index ", stage_index, " is not a stage; give one from 0 to ",
              num_stages_ - 1, ", or -1 (the default) for this rank's own stage, stage ", group_.rank(), ".");
  index_ = stage_index < 0 ? group_.rank() : stage_index;
  TORCH_CHECK(index_ < num_stages_, "PipelineStage: stage ", index_, " does not exist; the split has ", num_stages_,
              " stages (0 to ", num_stages_ - 1, ").");
  TORCH_CHECK(stage_index >= 0 || num_stages_ == group_.size(), "PipelineStage: the split has ", num_stages_,
              " stages for ", group_.size(), " pipeline ranks; with several stages per rank, build each with its "
              "stage_index (rank r holds r, r + ", group_.size(), ", ...).");
  TORCH_CHECK(index_ % group_.size() == group_.rank(), "PipelineStage: stage ", index_, " runs on pipeline rank ",
              index_ % group_.size(), " (stage s on rank s % ", group_.size(), "), not on this rank ", group_.rank(),
              ".");
  // Every stage's parameters, as its module will name them, to find the ones stages share.
  std::vector<std::vector<detail::StageParameter>> stage_params;
  for (const auto& stage_range : ranges) {
    std::vector<detail::StageParameter> params;
    std::unordered_set<const void*> seen;  // as parameters(): each tensor once, under its first name
    for (int i = stage_range.first; i < stage_range.first + stage_range.count; ++i) {
      for (const auto& p : model->ptr(i)->named_parameters()) {
        if (seen.insert(p.value().unsafeGetTensorImpl()).second) {
          params.push_back({p.value().unsafeGetTensorImpl(), names[i] + "." + p.key()});
        }
      }
    }
    stage_params.push_back(std::move(params));
  }
  ties_ = std::make_shared<const detail::StageTies>(detail::find_ties(stage_params));
  const auto& range = ranges[index_];
  auto begin = model->begin() + range.first;
  for (int i = 0; i < range.count; ++i) module_->push_back(names[range.first + i], *(begin + i));
  if (any_deferred(*module_)) materialize_stage(*model, *module_);
}

std::vector<at::Tensor> PipelineStage::parameters() const {
  // FSDP registers this rank's shards on the wrapper, in module()'s order (DDP: module() itself).
  if (!data_parallel_.is_empty()) return unique_parameters(*data_parallel_);
  return unique_parameters(*module_);
}

void PipelineStage::set_data_parallel(DataParallel<torch::nn::SequentialImpl> wrapper) {
  const std::string where = "PipelineStage::set_data_parallel (stage " + std::to_string(index_) + ")";
  TORCH_CHECK(!wrapper.is_empty(), where, ": no wrapper given.");
  TORCH_CHECK(wrapper->module().get() == module_.get(), where, ": the wrapper wraps another module; wrap this "
              "stage's own, e.g. cpprun::DistributedDataParallel(stage.module(), mesh.group(\"dp\")).");
  TORCH_CHECK(data_parallel_.is_empty(), where, ": the stage is already wrapped (by set_data_parallel or the "
              "schedule's set_data_parallel_group); wrap it once.");
  // The schedule reduces once a step, after the stage's last backward.
  detail::DataParallelAccess::core(*wrapper).set_manual_finalization(true);
  data_parallel_ = std::move(wrapper);
}

void PipelineStage::set_state_dict_prefixes(std::vector<std::pair<std::string, std::string>> prefixes) {
  state_dict_prefixes_ = detail::checked_prefixes(std::move(prefixes));
}

void PipelineStage::set_tensor_parallel_group(ProcessGroup group) {
  const std::vector<int> ranks = get_process_group_ranks(group);
  for (const auto& [name, split] : tensor_parallel_splits(*module_)) {
    TORCH_CHECK(get_process_group_ranks(split.group) == ranks, "cpprun::PipelineStage::set_tensor_parallel_group: "
                "stage ", index_, "'s \"", name, "\" is split over another group; give the group its "
                "tensor-parallel modules use (mesh.group(\"tp\")).");
  }
  tensor_parallel_group_ = std::move(group);
}

at::Tensor PipelineStage::run_forward(const at::Tensor& input) {
  return data_parallel_.is_empty() ? module_->forward(input) : data_parallel_->forward(input);
}

double PipelineStage::clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) {
  return pipeline_clip_grad_norm({this}, max_norm, norm_type, error_if_nonfinite);
}

double pipeline_clip_grad_norm(const std::vector<PipelineStage*>& stages, double max_norm, double norm_type,
                               bool error_if_nonfinite) {
  TORCH_CHECK(!stages.empty() && stages[0] != nullptr, "pipeline_clip_grad_norm: no stages given; pass every stage "
              "this rank holds.");  // no pipeline group to tell the other ranks over
  std::vector<detail::GradientToClip> grads;
  // FSDP stages: each rank holds a shard of its stages' gradients, summed over the shard group too.
  const ProcessGroup* shard_group = nullptr;
  // A mistake one rank makes (one of its two stages given: each clipped by a part of the norm, the
  // others' wait in the norm's sum) is refused on every rank, as the stages' checkpoint calls do.
  std::exception_ptr fault;
  try {
    const PipelineStage& first = *stages[0];
    std::set<int> mine;
    for (const auto* stage : stages) {
      TORCH_CHECK(stage != nullptr, "pipeline_clip_grad_norm: a null stage.");
      TORCH_CHECK(stage->group().rank() == first.group().rank() && stage->group().size() == first.group().size(),
                  "pipeline_clip_grad_norm: the stages come from different pipeline groups.");
      TORCH_CHECK(mine.insert(stage->index()).second, "pipeline_clip_grad_norm: stage ", stage->index(),
                  " is given twice.");
    }
    TORCH_CHECK(static_cast<int>(stages.size()) * first.group().size() == first.num_stages(),
                "pipeline_clip_grad_norm: this rank holds ", first.num_stages() / first.group().size(),
                " of the split's ", first.num_stages(), " stages, but ", stages.size(), " were given; pass every "
                "stage this rank holds (PipelineStage::clip_grad_norm takes its own alone: with several stages per "
                "rank call cpprun::pipeline_clip_grad_norm with all of them), so that the norm is the whole model's.");
    std::unordered_set<const c10::TensorImpl*> seen;  // a tensor two of this rank's stages share: once
    for (const auto* stage : stages) {
      const ProcessGroup* sharded_over = detail::stage_shard_group(*stage);
      TORCH_CHECK(stage == stages[0] || (sharded_over == nullptr) == (shard_group == nullptr),
                  "pipeline_clip_grad_norm: stage ", stage->index(), " is ", sharded_over ? "" : "not ",
                  "sharded but stage ", stages[0]->index(), " is", shard_group ? "" : " not",
                  "; wrap a rank's stages alike.");
      if (stage == stages[0]) shard_group = sharded_over;
      const auto params = stage->parameters();
      // Names in the same order (FSDP registers its shards in module()'s): tensor-parallel layers'
      // split weights are parts of one gradient over their TP group.
      const auto names = unique_named_parameters(*stage->module_).keys();
      const auto splits = tensor_parallel_splits(*stage->module());
      TORCH_INTERNAL_ASSERT(names.size() == params.size(), "pipeline stage ", stage->index(), ": ", params.size(),
                            " parameters for ", names.size(), " names");
      const auto& tie_of = stage->ties_->tie_of.at(stage->index());
      for (size_t i = 0; i < params.size(); ++i) {
        if (!seen.insert(params[i].unsafeGetTensorImpl()).second) continue;
        // A tied weight is counted by the rank of the first stage holding it.
        const bool counted = tie_of[i] < 0 || mine.count(stage->ties_->ties[tie_of[i]].stages.front()) > 0;
        std::optional<ProcessGroup> split_over;
        if (auto split = splits.find(names[i]); split != splits.end()) split_over = split->second.group;
        grads.push_back({params[i].grad(), split_over, counted});
      }
    }
  } catch (...) {
    fault = std::current_exception();
  }
  detail::share_failure(stages[0]->group(), fault, "cpprun::pipeline_clip_grad_norm");
  // Each rank's stages hold a disjoint part of the model: the squares add up over the group (after
  // the TP parts' own sums: see clip_grad_norm.h).
  return detail::clip_grad_norm(grads, {max_norm, norm_type, error_if_nonfinite}, &stages[0]->group(),
                                "cpprun::PipelineStage", shard_group);
}

}  // namespace cpprun
