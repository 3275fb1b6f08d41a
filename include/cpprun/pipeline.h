// Pipeline parallelism: a model cut into stages by the names of its children, each rank of a
// pipeline group holding its own stage(s), and schedules (GPipe, 1F1B, Interleaved 1F1B, zero
// bubble) that run
// one training step's micro-batches through the stages: activations forward and gradients back as
// point-to-point messages (Gloo on CPU, NCCL on CUDA), as torch.distributed.pipelining does.
//
//   torch::nn::Sequential net({{"embed", Embed(cfg)}, {"block0", Block(cfg)}, ..., {"head", Head(cfg)}});
//   cpprun::PipelineStage stage(net, {{"embed", "block0", "block1"}, {"block2", "block3", "head"}}, group);
//   cpprun::Schedule1F1B schedule(stage, /*microbatches=*/8, loss_fn);   // loss_fn(output, target)
//   torch::optim::AdamW opt(stage.parameters(), 3e-4);
//   for (...) {
//     opt.zero_grad();
//     at::Tensor loss = schedule.step(tokens, targets);  // mean micro-batch loss, on every rank
//     stage.clip_grad_norm(1.0);                          // the whole model's norm
//     opt.step();
//   }
//
// Every rank passes the same split (and may pass the step's inputs and targets: the first stage
// reads the inputs, the last the targets, the others neither). The gradients equal those of the
// unsplit model on the whole batch with the mean of the micro-batch losses, i.e. of the batch's
// loss when loss_fn is a mean (PyTorch's scale_grads=True). See docs/pipeline_parallel.md.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/data_parallel.h"
#include "cpprun/process_group.h"

namespace cpprun {

namespace detail {
struct StageTies;    // pipeline/tied_parameters.h
struct StageAccess;  // pipeline/stage_access.h: what the library's pipeline code reads of a stage
}  // namespace detail
class GradScaler;  // cpprun/grad_scaler.h

// The child names of each stage, stage 0 first.
using PipelineSplit = std::vector<std::vector<std::string>>;

// `model`'s children in `stages` runs of as equal length as can be (the first stages get one
// more child when they do not divide), e.g. to start from; real models usually give the first and
// last stages fewer blocks, as they also hold the embedding and the head.
PipelineSplit split_evenly(const torch::nn::Sequential& model, int stages);

class PipelineStage;
// clip_grad_norm over all the stages this rank holds (interleaved schedules): see
// PipelineStage::clip_grad_norm.
double pipeline_clip_grad_norm(const std::vector<PipelineStage*>& stages, double max_norm, double norm_type = 2.0,
                               bool error_if_nonfinite = false);
class PipelineSchedule;

class PipelineStage {
 public:
  // Stage `stage_index` of `model` cut by `split` (one list of child names per stage, in the
  // model's order; every child in exactly one stage; a mistake is an error naming the child),
  // for the pipeline over `group`: stage s runs on the group's rank s % group.size(), so with
  // one stage per rank stage r is rank r, and with v stages per rank (interleaved schedules)
  // rank r holds r, r + p, ..., r + (v-1) p. stage_index -1: group.rank() (one stage per rank).
  // Parameters that are deferred (deferred_init.h) are materialised for this stage only, with
  // the values the unsplit model would have: no rank materialises the whole model.
  // A parameter that several stages' children share (a head tied to the token embedding) is
  // tied: the ranks holding it sum its gradients at the end of each step(), so their copies
  // take the unsplit model's step, and clip_grad_norm counts it once.
  PipelineStage(const torch::nn::Sequential& model, const PipelineSplit& split, ProcessGroup group,
                int stage_index = -1);

  int index() const { return index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  const ProcessGroup& group() const { return group_; }
  // This stage's children, in order, sharing the model's parameters.
  torch::nn::Sequential module() const { return module_; }
  // Each tensor once (a weight two of its children share, too), for the optimizer. A rank with
  // several stages that share one gives it to the optimizer once as well. In FSDP
  // (set_data_parallel), this rank's shards: build the optimizer after wrapping.
  std::vector<at::Tensor> parameters() const;
  // Scales the gradients so that the norm of the whole model's (every stage's) is at most
  // max_norm, as clip_grad_norm_ on the unsplit model; returns that norm before clipping, on
  // every rank. Collective over the pipeline group: every rank calls it, with all its stages
  // (pipeline_clip_grad_norm below) when it holds several; some of them is an error on every rank.
  // norm_type and error_if_nonfinite as DataParallel::clip_grad_norm's.
  double clip_grad_norm(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);
  // Data parallelism inside the stage (a {pp, dp} or {pp, dp, tp} mesh): `wrapper` wraps
  // module() over the ranks that hold this stage in the other pipelines, e.g.
  //   stage.set_data_parallel(cpprun::DistributedDataParallel(stage.module(), mesh.group("dp")));
  //   stage.set_data_parallel(cpprun::FullyShardedDataParallel(stage.module(), mesh.group("dp"), opts));
  // From then on the schedule runs the stage's forwards through it, lets each micro-batch's
  // backward accumulate locally (unsharded, as under no_sync), and reduces the stage's gradients
  // once per step after its last backward (as PyTorch's pipelining with FSDP2's manual
  // finalization); step() returns the loss averaged over the pipelines. Wrap every stage of every
  // rank alike (all DDP, or all FSDP: clipping sums over the shard group on every rank).
  void set_data_parallel(DataParallel<torch::nn::SequentialImpl> wrapper);
  // The wrapper set_data_parallel() gave, or null.
  const DataParallel<torch::nn::SequentialImpl>& data_parallel() const { return data_parallel_; }
  // module()'s forward, through the data-parallel wrapper when there is one: what the schedule runs.
  at::Tensor run_forward(const at::Tensor& input);
  // Checkpoint names (cpprun/pipeline_state_dict.h). By default the stages save and load under the
  // Sequential's names ("h3.attn.weight"). A Sequential assembled from another model's modules
  // saves under that model's state_dict() names instead, so that the checkpoint is that model's
  // (it loads into it, into PyTorch's twin, into transformers): each (from, to) replaces a name's
  // leading module path `from` by `to` (empty: the rest alone), the longest `from` winning, e.g.
  //   stage.set_state_dict_prefixes({{"embed", "transformer"}, {"h3.block", "transformer.h.3"},
  //                                  {"ln_f", "transformer.ln_f"}, {"head", "lm_head"}});
  // turns "h3.block.attn.c_attn.weight" into "transformer.h.3.attn.c_attn.weight". Every rank
  // gives every stage the same list (a weight tied across stages is found by the other stage's
  // name); a path given twice, or two tensors given one name, is an error naming them.
  void set_state_dict_prefixes(std::vector<std::pair<std::string, std::string>> prefixes);
  const std::vector<std::pair<std::string, std::string>>& state_dict_prefixes() const { return state_dict_prefixes_; }
  // With tensor parallelism inside the stages (a {pp, tp} or {pp, dp, tp} mesh): the stage's
  // tensor-parallel group, mesh.group("tp"). Checkpoints learn it from the stage's
  // tensor-parallel modules; a stage that holds none (a final norm and a head, say) is held whole
  // by each rank of that group, and needs to be told, so that its tensors are written once and
  // loaded onto every one of them (otherwise a save or load refuses, naming this call). Harmless
  // for a stage that holds some: the group must then be theirs.
  void set_tensor_parallel_group(ProcessGroup group);
  const std::optional<ProcessGroup>& tensor_parallel_group() const { return tensor_parallel_group_; }

 private:
  friend class PipelineSchedule;
  friend struct detail::StageAccess;
  friend double pipeline_clip_grad_norm(const std::vector<PipelineStage*>& stages, double max_norm, double norm_type,
                                        bool error_if_nonfinite);

  torch::nn::Sequential module_;
  DataParallel<torch::nn::SequentialImpl> data_parallel_{nullptr};
  std::shared_ptr<const detail::StageTies> ties_;  // of the whole split, the same on every rank
  ProcessGroup group_;
  int index_;
  int num_stages_;
  std::vector<std::pair<std::string, std::string>> state_dict_prefixes_;  // see set_state_dict_prefixes
  std::optional<ProcessGroup> tensor_parallel_group_;  // see set_tensor_parallel_group
  std::string split_text_;  // the whole split, "embed,h0|h1,ln_f", which the schedule's ranks compare
};

// What the last step() did on this rank: for measuring bubbles and activation memory.
struct PipelineStepStats {
  double seconds = 0;          // the whole step, loss broadcast included
  double waiting_seconds = 0;  // blocked on neighbour stages' messages, and in the closing loss broadcast
  int peak_held = 0;           // most (stage, micro-batch) forwards whose backward (split: weight pass) had not run yet
  double bubble_fraction() const { return seconds > 0 ? waiting_seconds / seconds : 0.0; }
};

// One training step's forward and backward passes over micro-batches, the order set by the
// schedule (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZeroBubble below).
class PipelineSchedule {
 public:
  // The loss of one micro-batch: the last stage's output and that micro-batch's targets.
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  virtual ~PipelineSchedule();
  PipelineSchedule(const PipelineSchedule&) = delete;
  PipelineSchedule& operator=(const PipelineSchedule&) = delete;

  // Splits `inputs` (read on the first stage's rank) and `targets` (on the last's) along dim 0
  // into the micro-batches, runs every forward and backward pass, and returns the mean of the
  // micro-batch losses as a 0-dimensional float64 CPU tensor on every rank of the pipeline.
  // Gradients accumulate into the stages' parameters (zero them before, as usual). Every rank of
  // the pipeline group calls it; the batch must divide into the micro-batches.
  at::Tensor step(const at::Tensor& inputs = {}, const at::Tensor& targets = {});
  // Forward passes only, without gradients (evaluation): the micro-batches go through the stages
  // in order and the mean micro-batch loss comes back on every rank, as from step(). Every rank
  // of the pipeline group calls it together: eval() on some ranks and step() on others is an
  // error on every rank, naming which ran which.
  at::Tensor eval(const at::Tensor& inputs = {}, const at::Tensor& targets = {});
  // Data parallelism across pipelines (a {pp, dp} mesh): wraps each of this rank's stages that
  // has trainable parameters in DistributedDataParallel over `group` (the ranks that hold the same
  // stages in the other pipelines, each pipeline on its own batch; see
  // PipelineStage::set_data_parallel), so every step() ends with the stages' gradients averaged
  // across pipelines, and returns the loss averaged over the pipelines too: the mean over every
  // pipeline's micro-batches (eval() alike). Every rank calls it, with its own such group.
  void set_data_parallel_group(const ProcessGroup& group);
  // fp16 loss scaling: from now on each micro-batch's loss is multiplied by scaler.scale() before
  // its backward (on the last stage), while step() and microbatch_losses() stay unscaled. Build
  // the scaler over a group holding every stage (the pipeline group, or the whole {dp, pp} world):
  // each rank holds only its stage's gradients, and scaler.step(optimizer) after step() then skips
  // on every stage when any stage overflowed. Every rank calls it; the scaler must outlive the
  // schedule (or the next call).
  void set_grad_scaler(GradScaler& scaler);
  // PyTorch's scale_grads (its schedules' constructor argument): true, the default, gives the
  // gradients of the mean micro-batch loss (each backward starts from loss / microbatches); false,
  // those of their sum (each from the loss itself), for a loss_fn that already divides. step()
  // returns the mean micro-batch loss either way.
  void set_scale_grads(bool scale);
  // The last step's (or eval's) loss of each micro-batch, on every rank.
  const std::vector<double>& microbatch_losses() const;
  const PipelineStepStats& last_step_stats() const;
  int microbatches() const;

 protected:
  enum class Order { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubble, kLoopedBFS };
  PipelineSchedule(std::vector<PipelineStage*> stages, int microbatches, LossFn loss, Order order);

 private:
  struct Runtime;  // pipeline/schedule_runtime.cpp
  std::unique_ptr<Runtime> runtime_;
};

// All forwards, then all backwards: every micro-batch's activations are held at once.
class ScheduleGPipe : public PipelineSchedule {
 public:
  ScheduleGPipe(PipelineStage& stage, int microbatches, LossFn loss);
};

// One forward, one backward (PipeDream-Flush): the same bubble as GPipe, but rank r holds at
// most p - r micro-batches' activations.
class Schedule1F1B : public PipelineSchedule {
 public:
  Schedule1F1B(PipelineStage& stage, int microbatches, LossFn loss);
};

// Zero bubble (after ZB-H1, Qi et al. 2024): each backward split into the input's gradient,
// sent back at once in 1F1B's order, and the weights' gradients, run where the rank would
// otherwise wait for a message (or before a forward past min(p, m) micro-batches held, 1F1B's
// first rank's peak), whatever the passes really cost. With a forward, an input pass and a weight
// pass costing alike, p - 1 idle slots a step (m >= p) against 1F1B's 3(p - 1). One stage per
// rank, as PyTorch's ScheduleInterleavedZeroBubble with one stage each. The first stage (no input
// gradient to send) runs its whole backward at once; see docs/pipeline_parallel.md.
class ScheduleZeroBubble : public PipelineSchedule {
 public:
  ScheduleZeroBubble(PipelineStage& stage, int microbatches, LossFn loss);
};

// Megatron-LM's interleaved 1F1B over v stages per rank (given in order: stage r, r + p, ...):
// the bubble shrinks by v, at v times the messages. Micro-batches: any count its max(1, m / ranks)
// rounds divide, as PyTorch's (the bubble is smallest for a multiple of the ranks).
class ScheduleInterleaved1F1B : public PipelineSchedule {
 public:
  ScheduleInterleaved1F1B(std::vector<PipelineStage*> stages, int microbatches, LossFn loss);
};

// PyTorch's ScheduleLoopedBFS over v stages per rank (given in order: stage r, r + p, ...): GPipe
// looped breadth first, every micro-batch through the rank's first stage, then its next; the
// backwards in reverse. Interleaved's bubble (m >= p) for all m * v micro-batches' activations
// held at once; any number of micro-batches.
class ScheduleLoopedBFS : public PipelineSchedule {
 public:
  ScheduleLoopedBFS(std::vector<PipelineStage*> stages, int microbatches, LossFn loss);
};

// A schedule by its name, as PyTorch's get_schedule_class(name) finds one (for a command-line
// flag): "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs" or "zero-bubble", case, '-' and '_'
// aside, with or without "Schedule" before it (PyTorch's class names "GPipe", "1F1B",
// "Interleaved1F1B", "LoopedBFS" name the same ones, and "InterleavedZeroBubble" the zero bubble).
// `stages`: this rank's, one for all but interleaved-1f1b and looped-bfs. Another name is an error
// listing these (naming PyTorch's class where it is one of PyTorch's that cpprun lacks).
std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name, std::vector<PipelineStage*> stages,
                                                int microbatches, PipelineSchedule::LossFn loss);

}  // namespace cpprun
