// PipelineSchedule: carries out a schedule's plan (schedule_plan.h) for this rank's stages. Each
// pass receives what it needs (the previous stage's activation, the next stage's gradient), runs
// its stage and sends what the neighbour needs; sends never block. Neighbour stages on the same
// rank (interleaved, one rank) hand tensors over in memory.
//
// Note [One batch per pass]
// A pass's sends go out in one batch (batch_isend_irecv) with the receive the next pass needs, as
// PyTorch's 1F1B fuses a forward's send with the next backward's receive. On NCCL a receive holds
// its stream until its data comes: had a rank posted the next pass's receive before computing and
// sending, two neighbours could each wait on a receive queued ahead of the send the other needs
// (in 1F1B's steady state, stage s's receive of a gradient before its activation send, stage s+1's
// receive of that activation before its gradient send). In one NCCL group the two progress
// together. Between two ranks each direction's messages are therefore posted in the schedule's
// order at both ends, which batched headers check on Gloo as well (Note [Batched messages]), so a
// plan whose ends disagree fails on the CPU rather than hangs on GPUs. The step's shape messages
// stay single messages: a receive that waits for one posts its own batch.
// On the CPU (Gloo) nothing holds a stream, and a receive posted before the pass computes lets
// the message travel meanwhile: there the next pass's receive goes ahead in a batch of its own
// (1F1B at 2 ranks, 8 micro-batches: 130-153 ms a step against 157-165 ms fused, three runs
// each). Each direction's order is the same either way, so the CPU's tests check the pairing the
// GPUs' fused batches get; CPPRUN_PIPELINE_FUSED_RECEIVES=1 runs the fused order on the CPU too
// (its test), =0 posts ahead on GPUs.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpprun/collectives.h"
#include "cpprun/ddp.h"
#include "cpprun/grad_scaler.h"
#include "cpprun/object_collectives.h"
#include "cpprun/pipeline.h"
#include "cpprun/point_to_point.h"
#include "cpprun/tensor_parallel_split.h"
#include "cpprun/unique_parameters.h"
#include "comm/group_membership.h"
#include "comm/labelled_messages.h"
#include "comm/public_call.h"
#include "pipeline/schedule_plan.h"
#include "pipeline/split_backward.h"
#include "pipeline/stage_access.h"
#include "pipeline/stage_wrapper.h"
#include "pipeline/stage_messages.h"
#include "pipeline/tied_parameters.h"

namespace cpprun {

namespace {

using detail::PassKind;
using detail::PipelinePass;
using detail::StageMessage;

std::string message_of(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

const ProcessGroup& group_of(const std::vector<PipelineStage*>& stages) {
  TORCH_CHECK(!stages.empty() && stages[0] != nullptr, "PipelineSchedule: no stages given.");
  return stages[0]->group();
}

// Note [One schedule on every pipeline rank]
// Ranks given different splits would each run their own idea of the stages (a layer run twice, a
// loss silently wrong), and different schedules or micro-batch counts would wait for messages
// never sent until the group's timeout. So the ranks compare what they were given as the schedule
// is built, before anything else that could differ between them (a collective over the pipeline
// group), and each refuses a difference, naming the rank. A rank whose own checks refused its
// schedule (a name that names none, a null loss, too few stages) still takes part, sending its
// refusal instead: a caller that catches the error on that rank must not leave the others waiting
// in the exchange until the timeout.
constexpr char kRefusedMark = '\x01';

// Collective over `group`: one all-gather. `mine` describes this rank's schedule, or is a
// refusal (refused_schedule's). Throws this rank's refusal, else another rank's, else a
// difference; returns when every rank was given the same.
void agree_on_schedule(const ProcessGroup& group, const char* kind, const std::string& mine) {
  const std::vector<std::string> all = all_gather_bytes(group, mine);
  TORCH_CHECK(mine.empty() || mine[0] != kRefusedMark, mine.substr(1));
  for (std::size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r].empty() || all[r][0] != kRefusedMark, kind, ": the pipeline's rank ", r,
                " refused its schedule, so every rank does: ", all[r].substr(1));
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    TORCH_CHECK(all[r] == all[0], kind, ": the pipeline's ranks were given different schedules: rank 0 ", all[0],
                "; rank ", r, " ", all[r], ". Build every rank's stages from one split, and its schedule with the "
                "same name and micro-batches.");
  }
}

std::string refused_schedule(const std::string& why) { return kRefusedMark + why; }

// A refusal found before the schedule exists, sent into the exchange the others are in (they
// refuse it too), then thrown here.
[[noreturn]] void refuse_on_every_rank(const ProcessGroup& group, const std::string& why) {
  agree_on_schedule(group, "cpprun::make_schedule", refused_schedule(why));
  TORCH_INTERNAL_ASSERT(false, "make_schedule: a refusal returned");
}

std::string schedule_text(const char* kind, const std::vector<PipelineStage*>& stages, int microbatches) {
  return std::string(kind) + " over " + std::to_string(microbatches) + " micro-batches, split " +
         detail::StageAccess::split_text(*stages[0]);
}

// What this rank alone can find wrong with the schedule it was given; none when nothing.
std::optional<std::string> refuse_locally(detail::ScheduleKind kind, const detail::PipelineShape& shape,
                                          const std::vector<PipelineStage*>& stages, bool has_loss, int rank) {
  const char* name = detail::to_string(kind);
  std::set<int> indices;
  for (auto* stage : stages) {
    if (stage == nullptr || stage->num_stages() != stages[0]->num_stages()) {
      return std::string(name) + ": the stages come from different splits.";
    }
    if (!indices.insert(stage->index()).second) {
      return std::string(name) + ": stage " + std::to_string(stage->index()) + " given twice.";
    }
  }
  if (!has_loss) {
    return std::string(name) + ": a loss function is needed; the last stage's output and targets go into it.";
  }
  if (auto why = detail::refuse_shape(kind, shape)) return why;
  if (static_cast<int>(stages.size()) == shape.stages_per_rank) return std::nullopt;
  std::ostringstream why;
  const int num_stages = stages[0]->num_stages();
  why << name << ": this rank " << rank << " holds " << shape.stages_per_rank << " of the " << num_stages << " stages ("
      << num_stages << " stages over " << shape.ranks << " ranks), but " << stages.size() << " were given.";
  return why.str();
}

// Whether the next pass's receive joins this pass's sends (Note [One batch per pass]).
bool fuse_receives(const at::Device& device) {
  const char* forced = std::getenv("CPPRUN_PIPELINE_FUSED_RECEIVES");
  if (forced == nullptr || *forced == '\0') return device.is_cuda();
  const std::string value = forced;
  TORCH_CHECK(value == "0" || value == "1", "CPPRUN_PIPELINE_FUSED_RECEIVES is '", value, "'; set it to 1 (post ",
              "the next pass's receive in one batch with this pass's sends, the default on GPUs), 0 (post it ",
              "before the pass computes, the default on the CPU), or leave it unset.");
  return value == "1";
}

bool carries_gradient(const at::Tensor& activation) { return at::isFloatingType(activation.scalar_type()) ||
                                                             at::isComplexType(activation.scalar_type()); }

}  // namespace

struct PipelineSchedule::Runtime {
  // A receive posted ahead of the pass that needs it.
  struct Pending {
    at::Tensor into;
    Work work;
  };
  // What a (stage, micro-batch) keeps from its forward until its backward (split: until its
  // weight pass).
  struct Held {
    at::Tensor input;   // requires grad when the previous stage waits for its gradient
    at::Tensor output;  // the stage's output (the last stage: undefined)
    at::Tensor loss;    // the last stage: this micro-batch's loss, for backward
    std::shared_ptr<detail::SplitBackward> weights_left;  // after its input pass: the weight pass
  };
  using Key = std::pair<int, int>;  // (stage, micro-batch)
  using MessageKey = std::tuple<StageMessage, int, int>;  // (message, receiving stage, micro-batch)

  explicit Runtime(ProcessGroup pipeline_group) : group(std::move(pipeline_group)) {}

  std::map<int, PipelineStage*> stages;  // this rank's, by index
  ProcessGroup group;
  detail::ScheduleKind kind;
  detail::PipelineShape shape;
  std::vector<PipelinePass> plan;
  std::vector<PipelinePass> eval_plan;  // forwards only: by micro-batch, then stage
  bool training = true;                 // this step's: false in eval()
  LossFn loss_fn;
  std::vector<double> losses;
  PipelineStepStats stats;
  // A tied parameter this rank holds, and the ranks holding it (see tied_parameters.h): found at
  // each step, in stage->parameters(), which are the shards once the stage is in FSDP.
  struct TieSum {
    PipelineStage* stage;
    size_t index;  // in stage->parameters()
    ProcessGroup holders;
    size_t tie;          // in cross_rank_ties
    at::Tensor earlier;  // the gradient this step began with: kept out of the sum (see the step's end)
  };
  std::vector<TieSum> tie_sums;
  // Every tie whose holders are on two or more ranks, as "stage 0's embed.weight, stage 1's
  // head.weight": the same list on every rank, whether it holds them or not.
  std::vector<std::string> cross_rank_ties;
  std::optional<ProcessGroup> data_parallel;  // set_data_parallel_group's (its stages wrapped in DDP)
  GradScaler* scaler = nullptr;               // set_grad_scaler's
  bool scale_grads = true;                    // set_scale_grads's: backward from loss / microbatches
  std::optional<at::Device> device;  // where received tensors go: the stages' parameters'

  // One step's state.
  std::vector<at::Tensor> input_chunks, target_chunks;
  std::map<Key, Held> held;
  std::map<Key, at::Tensor> handed_activation, handed_gradient;  // from a stage on this rank
  std::map<int, Pending> shape_recv;                              // per stage with a remote predecessor
  std::map<int, at::Tensor> sent_shape;                           // per stage with a remote successor
  std::map<MessageKey, Pending> recvs;
  struct Sent {
    at::Tensor tensor;  // alive until taken
    Work work;
    int from_stage, to_stage;
  };
  std::vector<Sent> sends;
  // What the current pass will post in its one batch (Note [One batch per pass]).
  struct Queued {
    P2POp op;
    std::string label;
    std::optional<MessageKey> receive;  // a receive's key in recvs; none for a send
    int from_stage = 0, to_stage = 0;   // a send's
  };
  std::vector<Queued> batch;

  int last_stage() const { return shape.stages() - 1; }
  int rank_of(int stage) const { return shape.rank_of(stage); }
  bool remote(int stage) const { return rank_of(stage) != group.rank(); }
  int tag(StageMessage message, int stage, int microbatch) const {
    return detail::stage_message_tag(message, stage, microbatch, shape.microbatches, shape.stages());
  }
  std::string where(int stage) const {
    return "pipeline stage " + std::to_string(stage) + " (rank " + std::to_string(group.rank()) + ")";
  }

  void wait(Work& work, int stage, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    try {
      work.wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, where(stage), " waiting for ", what, ": ", message_of(e));
    }
    stats.waiting_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // A rank whose stages have no parameters receives where its process computes.
  at::Device receive_device() const { return device.value_or(local_device()); }

  // The message `pass` receives from a stage on another rank; none when it needs none (the first
  // stage's forward, the last stage's backward, a neighbour on this rank, an output that carries no
  // gradient, a weight pass).
  std::optional<MessageKey> remote_message(const PipelinePass& pass) const {
    switch (pass.kind) {
      case PassKind::kForward:
        if (pass.stage == 0 || !remote(pass.stage - 1)) return std::nullopt;
        return std::make_tuple(StageMessage::kActivation, pass.stage, pass.microbatch);
      case PassKind::kBackward:
      case PassKind::kBackwardInput: {
        if (pass.stage == last_stage() || !remote(pass.stage + 1)) return std::nullopt;
        auto found = held.find({pass.stage, pass.microbatch});
        if (found == held.end() || !carries_gradient(found->second.output)) return std::nullopt;
        return std::make_tuple(StageMessage::kGradient, pass.stage, pass.microbatch);
      }
      case PassKind::kBackwardWeight: return std::nullopt;
    }
    return std::nullopt;
  }

  // Posts the receive `pass` needs, when it needs one from another rank and its size is known.
  // blocking: wait for the step's shape message if that is what is missing.
  void post_receive(const PipelinePass& pass, bool blocking) {
    const auto key = remote_message(pass);
    if (!key || recvs.count(*key)) return;
    if (pass.kind == PassKind::kForward) {
      auto& shape_message = shape_recv.at(pass.stage);
      if (!blocking && !shape_message.work.is_completed()) return;
      wait(shape_message.work, pass.stage,
           "the shape of stage " + std::to_string(pass.stage - 1) + "'s output (from rank " +
               std::to_string(rank_of(pass.stage - 1)) + ", which has not sent it; is it running the same schedule?)");
      at::Tensor into = detail::empty_from_shape(shape_message.into, receive_device());
      queue_receive(*key, into, pass.stage - 1);
    } else {
      at::Tensor into = at::empty_like(held.at({pass.stage, pass.microbatch}).output, at::MemoryFormat::Contiguous);
      queue_receive(*key, into, pass.stage + 1);
    }
  }

  at::Tensor take_receive(StageMessage message, const PipelinePass& pass, int from_stage) {
    auto it = recvs.find(std::make_tuple(message, pass.stage, pass.microbatch));
    TORCH_INTERNAL_ASSERT(it != recvs.end(), "pipeline: no receive posted for ", detail::to_string(pass));
    Pending pending = std::move(it->second);
    recvs.erase(it);
    wait(pending.work, pass.stage,
         std::string(message == StageMessage::kActivation ? "the activation" : "the gradient") + " of micro-batch " +
             std::to_string(pass.microbatch) + " from stage " + std::to_string(from_stage) + " (rank " +
             std::to_string(rank_of(from_stage)) + ")");
    return pending.into;
  }

  // A shape message goes at once, on its own; an activation or gradient joins the pass's batch.
  void send(at::Tensor tensor, int to_stage, StageMessage message, int tag_stage, int microbatch) {
    tensor = tensor.contiguous();
    const int from_stage = message == StageMessage::kGradient ? tag_stage + 1 : tag_stage;
    std::string label = detail::stage_message_label(message, true, from_stage, to_stage, microbatch);
    const int to = rank_of(to_stage), message_tag = tag(message, tag_stage, microbatch);
    if (message == StageMessage::kShape) {
      Work work = detail::isend_labelled(group, tensor, to, message_tag, std::move(label));
      sends.push_back({tensor, std::move(work), from_stage, to_stage});
      return;
    }
    batch.push_back({P2POp{P2POp::Op::kIsend, tensor, to, message_tag}, std::move(label), std::nullopt, from_stage,
                     to_stage});
  }

  // Posts the receive of the step's shape message for `stage` from `stage - 1` (on another rank).
  Work receive_shape(const at::Tensor& into, int stage) {
    return detail::irecv_labelled(group, into, rank_of(stage - 1), tag(StageMessage::kShape, stage - 1, 0),
                                  detail::stage_message_label(StageMessage::kShape, false, stage, stage - 1, 0));
  }

  // Queues the receive `key` names (an activation or gradient for key's stage from `from_stage`,
  // on another rank) into the pass's batch.
  void queue_receive(const MessageKey& key, const at::Tensor& into, int from_stage) {
    const auto [message, stage, microbatch] = key;
    const int tag_stage = message == StageMessage::kGradient ? stage : from_stage;
    batch.push_back({P2POp{P2POp::Op::kIrecv, into, rank_of(from_stage), tag(message, tag_stage, microbatch)},
                     detail::stage_message_label(message, false, stage, from_stage, microbatch), key, 0, 0});
    recvs[key] = {into, Work()};  // its work once the batch is posted
  }

  // Posts what the pass queued, as one batch (Note [One batch per pass]).
  void post_batch() {
    if (batch.empty()) return;
    std::vector<P2POp> ops;
    std::vector<std::string> labels;
    for (auto& queued : batch) {
      ops.push_back(queued.op);
      labels.push_back(std::move(queued.label));
    }
    // Activations and gradients, whose dtype and size this step's shape message agreed (the
    // sender checks each against it): posted as they are on Gloo (Note [Messages of agreed size]).
    std::vector<Work> works = detail::batch_isend_irecv_agreed(group, std::move(ops), std::move(labels));
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].receive) {
        recvs.at(*batch[i].receive).work = std::move(works[i]);
      } else {
        sends.push_back({batch[i].op.tensor, std::move(works[i]), batch[i].from_stage, batch[i].to_stage});
      }
    }
    batch.clear();
  }

  // A sent tensor is kept until its receiver has taken it; those taken go now rather than at the
  // step's end, so that 1F1B's activation memory is not held up by the messages it sent.
  void release_taken_sends() {
    for (auto it = sends.begin(); it != sends.end();) {
      if (!it->work.is_completed()) {
        ++it;
        continue;
      }
      wait(it->work, it->from_stage, "stage " + std::to_string(it->to_stage) + " to take a message");  // its error, if any
      it = sends.erase(it);
    }
  }

  void forward(const PipelinePass& pass) {
    PipelineStage& stage = *stages.at(pass.stage);
    Held state;
    if (pass.stage == 0) {
      state.input = input_chunks.at(pass.microbatch);
    } else {
      at::Tensor received = remote(pass.stage - 1)
                                ? take_receive(StageMessage::kActivation, pass, pass.stage - 1)
                                : handed_activation.at({pass.stage, pass.microbatch});
      handed_activation.erase({pass.stage, pass.microbatch});
      state.input = training && carries_gradient(received) ? received.detach().requires_grad_(true) : received;
    }
    // A stage's own error (shapes that do not fit, a dtype) names the stage and micro-batch, as
    // PyTorch's "[Stage 1] failed to run forward". A c10::Error keeps its type with the context added;
    // any other exception (a user's std::runtime_error) becomes a c10::Error with the context and its
    // message, the original nested in it (std::rethrow_if_nested), as PyTorch's `raise ... from e`.
    auto context = [&](const char* what) {
      return where(pass.stage) + ": " + what + " of micro-batch " + std::to_string(pass.microbatch) +
             " failed (its input " + detail::describe_shape(detail::encode_shape(state.input)) + ")";
    };
    auto run_in_context = [&](const char* what, const auto& run) {
      try {
        return run();
      } catch (c10::Error& e) {
        e.add_context(context(what));
        throw;
      } catch (const std::exception& e) {
        std::throw_with_nested(
            c10::Error(c10::SourceLocation{__func__, __FILE__, __LINE__}, context(what) + ": " + e.what()));
      }
    };
    at::Tensor output = run_in_context("the forward", [&] { return stage.run_forward(state.input); });
    if (pass.stage == last_stage()) {
      state.loss = run_in_context("the loss function",
                                  [&] { return loss_fn(output, target_chunks.at(pass.microbatch)); });
      TORCH_CHECK(state.loss.defined() && state.loss.numel() == 1, where(pass.stage),
                  ": the loss function must return one value per micro-batch (e.g. the mean loss), got ",
                  state.loss.defined() ? state.loss.sizes() : at::IntArrayRef{}, ".");
      losses[pass.microbatch] = state.loss.detach().to(at::kDouble).item<double>();
    } else if (remote(pass.stage + 1)) {
      auto& sent = sent_shape[pass.stage];
      at::Tensor encoded = detail::encode_shape(output);
      if (!sent.defined()) {
        sent = encoded;
        send(encoded, pass.stage + 1, StageMessage::kShape, pass.stage, 0);
      } else {
        TORCH_CHECK(at::equal(sent, encoded), where(pass.stage), ": the output of micro-batch ", pass.microbatch,
                    " is ", detail::describe_shape(encoded), " but this step's first was ",
                    detail::describe_shape(sent), "; a stage's outputs must keep one shape and dtype within a step.");
      }
      send(output.detach(), pass.stage + 1, StageMessage::kActivation, pass.stage, pass.microbatch);
      state.output = output;
    } else {
      handed_activation[{pass.stage + 1, pass.microbatch}] = output.detach();
      state.output = output;
    }
    if (!training) return;  // no backward to keep anything for
    held[{pass.stage, pass.microbatch}] = std::move(state);
    stats.peak_held = std::max(stats.peak_held, static_cast<int>(held.size()));
  }

  // A whole backward (kBackward), or its input pass (kBackwardInput: the weights' gradients
  // wait in the held state for backward_weight).
  void backward(const PipelinePass& pass) {
    auto it = held.find({pass.stage, pass.microbatch});
    TORCH_INTERNAL_ASSERT(it != held.end(), "pipeline: ", detail::to_string(pass), " before its forward");
    const bool split = pass.kind == PassKind::kBackwardInput;
    Held state = split ? it->second : std::move(it->second);
    if (!split) held.erase(it);
    // What the backward starts from: the last stage's loss, as the mean over micro-batches (the
    // gradients of the whole batch's mean loss), else the output with the next stage's gradient.
    std::vector<at::Tensor> roots, root_grads;
    if (pass.stage == last_stage()) {
      at::Tensor mean_part = scale_grads ? state.loss / shape.microbatches : state.loss;
      roots.push_back(scaler != nullptr ? scaler->scale(mean_part) : mean_part);
    } else if (carries_gradient(state.output)) {
      at::Tensor gradient = remote(pass.stage + 1) ? take_receive(StageMessage::kGradient, pass, pass.stage + 1)
                                                   : handed_gradient.at({pass.stage, pass.microbatch});
      handed_gradient.erase({pass.stage, pass.microbatch});
      if (state.output.requires_grad()) {
        roots.push_back(state.output);
        root_grads.push_back(gradient);
      }
    }
    const bool sends_gradient = pass.stage > 0 && carries_gradient(state.input);
    at::Tensor input_grad;
    if (split) {
      auto parts = std::make_shared<detail::SplitBackward>(roots, root_grads, sends_gradient ? state.input : at::Tensor(),
                                                           unique_parameters(*stages.at(pass.stage)->module()));
      input_grad = parts->input_grad();
      it->second.weights_left = std::move(parts);
    } else {
      if (!roots.empty()) torch::autograd::backward(roots, root_grads);
      if (sends_gradient) input_grad = state.input.grad();
    }
    if (!sends_gradient) return;
    if (!input_grad.defined()) input_grad = at::zeros_like(state.input);  // the output did not depend on it
    if (remote(pass.stage - 1)) {
      send(input_grad, pass.stage - 1, StageMessage::kGradient, pass.stage - 1, pass.microbatch);
    } else {
      handed_gradient[{pass.stage - 1, pass.microbatch}] = input_grad;
    }
  }

  // Whether what `pass` receives from another stage is here (or it needs nothing): if not,
  // zero bubble runs a weight pass rather than wait.
  bool message_arrived(const PipelinePass& pass) const {
    const auto key = remote_message(pass);
    if (!key) return true;
    auto it = recvs.find(*key);
    return it != recvs.end() && it->second.work.is_completed();
  }

  // The weight pass of a micro-batch whose input pass ran; then its activations go.
  void backward_weight(const PipelinePass& pass) {
    auto it = held.find({pass.stage, pass.microbatch});
    TORCH_INTERNAL_ASSERT(it != held.end() && it->second.weights_left, "pipeline: ", detail::to_string(pass),
                          " before its input pass");
    const auto parts = std::move(it->second.weights_left);
    held.erase(it);
    parts->backward_weights();
  }

  // The group the loss is averaged over: the pipelines' (set_data_parallel_group's, or that of the
  // stages' data-parallel wrappers, which must agree); none without data parallelism.
  std::optional<ProcessGroup> loss_group() const {
    if (data_parallel) return data_parallel;
    std::optional<ProcessGroup> found;
    for (const auto& [index, stage] : stages) {
      if (stage->data_parallel().is_empty()) continue;
      const ProcessGroup& over = stage->data_parallel()->process_group();
      TORCH_CHECK(!found || found->size() == over.size(), where(index), ": its data-parallel wrapper spans ",
                  over.size(), " ranks but stage ", stages.begin()->first, "'s spans ", found ? found->size() : 0,
                  "; a rank's stages are replicated across the same pipelines.");
      if (!found) found = over;
    }
    return found;
  }

  // For each of this rank's stages whose backwards are whole (not split into input and weight
  // passes), the place in `passes` of its last backward: before it, the stage's data-parallel
  // wrapper may start reducing (Note [A pipeline stage's last backward], ddp/reducer.cpp). A
  // split stage's weight gradients come from several autograd calls, and a weight two of this
  // rank's stages share (a tie, interleaved) gets its gradient in both stages' backwards: those
  // stages reduce at the step's end.
  std::map<size_t, PipelineStage*> last_backwards(const std::vector<PipelinePass>& passes) const {
    std::map<int, size_t> last;
    std::set<int> whole_only;
    for (const auto& [index, stage] : stages) whole_only.insert(index);
    for (size_t i = 0; i < passes.size(); ++i) {
      if (passes[i].kind == PassKind::kBackward) last[passes[i].stage] = i;
      if (passes[i].kind == PassKind::kBackwardInput) whole_only.erase(passes[i].stage);
    }
    std::map<int, std::vector<at::Tensor>> weights;  // of each of this rank's stages
    std::map<const c10::TensorImpl*, int> holders;    // of each weight, among those stages
    for (const auto& [index, stage] : stages) {
      weights[index] = unique_parameters(*stage->module());
      for (const auto& weight : weights[index]) ++holders[weight.unsafeGetTensorImpl()];
    }
    for (const auto& [index, stage_weights] : weights) {
      for (const auto& weight : stage_weights) {
        if (holders[weight.unsafeGetTensorImpl()] > 1) whole_only.erase(index);
      }
    }
    std::map<size_t, PipelineStage*> found;
    for (const auto& [stage, index] : last) {
      if (whole_only.count(stage)) found[index] = stages.at(stage);
    }
    return found;
  }

  // Each wrapped stage's gradients, accumulated over the step's micro-batches, reduced across the
  // pipelines: once, after the stage's last backward. Later stages first, the same order on every
  // rank of a data-parallel group (they hold the same stages).
  void finalize_data_parallel() {
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
      if (auto* core = detail::data_parallel_core(*it->second)) core->finalize_backward();
    }
  }

  // Note [A step's opening exchange]
  // Every rank learns, in one all-reduce at the start of step() and eval(), what the others were
  // given, and checks it alike, so that a mistake on one rank is one error on every rank rather than
  // that rank's error and the others' wait for messages that never come: the batch sizes the first
  // and last stages were given, whether each rank runs step() or eval() (eval() on rank 0 alone, to
  // log, left every rank waiting until the group's timeout with errors that never said why), and
  // whether each holder of a tie across ranks trains it (requires_grad) or not: its gradients are
  // summed over the holders only where it trains, and a sum on some holders alone would hang.
  void check_batch(const at::Tensor& inputs, const at::Tensor& targets) {
    constexpr int64_t kNotHere = -2;
    const char* call = training ? "step()" : "eval()";
    const int p = group.size(), me = group.rank();
    auto rows = [](const at::Tensor& t) -> int64_t { return t.defined() && t.dim() > 0 ? t.size(0) : -1; };
    // [0, 2): the rows (-1 for no tensor given, or a 0-dim one); [2, 2 + p): each rank's call (1
    // step(), 2 eval()); then per tie across ranks, per rank: 1 trains it, 2 holds it frozen, 0 not held.
    constexpr int64_t kStep = 1, kEval = 2, kTrains = 1, kFrozen = 2;
    const int64_t ties_at = 2 + p;
    at::Tensor given = at::zeros({ties_at + static_cast<int64_t>(cross_rank_ties.size()) * p}, at::kLong);
    given[0] = kNotHere;
    given[1] = kNotHere;
    if (stages.count(0)) given[0] = rows(inputs);
    if (stages.count(last_stage())) given[1] = rows(targets);
    given[2 + me] = training ? kStep : kEval;
    for (const auto& tie : tie_sums) {
      const bool trains = tie.stage->parameters().at(tie.index).requires_grad();
      given[ties_at + static_cast<int64_t>(tie.tie) * p + me] = trains ? kTrains : kFrozen;
    }
    try {
      all_reduce(group, given, ReduceOp::kMax);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "pipeline rank ", me, " (stage", stages.size() > 1 ? "s " : " ",
                  stages.begin()->first, stages.size() > 1 ? ", ..." : "",
                  ") waiting at the start of ", call, " for every pipeline rank to begin the step, which they did not "
                  "(a rank that runs fewer steps than the others, or another schedule, leaves them waiting here; "
                  "so does a step that failed on one rank and was caught there, its neighbours left waiting for "
                  "its messages): ",
                  message_of(e));
    }
    const auto ranks_with = [&](int64_t from, int64_t value) {
      std::string ranks;
      for (int r = 0; r < p; ++r) {
        if (given[from + r].item<int64_t>() == value) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      }
      return ranks;
    };
    const std::string stepping = ranks_with(2, kStep), evaluating = ranks_with(2, kEval);
    TORCH_CHECK(stepping.empty() || evaluating.empty(), "the pipeline's ranks called different things: pipeline "
                "rank(s) ", stepping, " step() and rank(s) ", evaluating, " eval(); every pipeline rank runs each "
                "step() and each eval() together (their stages pass one another's activations), so call eval() on "
                "every rank, e.g. to log its loss on rank 0 (found on rank ", me, ").");
    const int m = shape.microbatches;
    const int64_t input_rows = given[0].item<int64_t>(), target_rows = given[1].item<int64_t>();
    // The job's rank, and in a {pp, dp} mesh the pipeline group's too: a pipeline rank alone named
    // another process of the job than the user's logs show.
    const auto job_rank = [&](int pipeline_rank) {
      const std::vector<int> global = get_process_group_ranks(group);
      const int rank = global.empty() ? pipeline_rank : global.at(static_cast<size_t>(pipeline_rank));
      return "rank " + std::to_string(rank) +
             (rank == pipeline_rank ? std::string() : ", pipeline rank " + std::to_string(pipeline_rank));
    };
    for (const auto& [rows_given, what, stage] : {std::make_tuple(input_rows, "inputs", 0),
                                                  std::make_tuple(target_rows, "targets", last_stage())}) {
      if (rows_given > 0 && rows_given % m == 0) continue;
      const std::string at_stage = "pipeline stage " + std::to_string(stage) + " (" + job_rank(rank_of(stage)) + ")";
      TORCH_CHECK(rows_given >= 0, at_stage, " was given no ", what, " (or a 0-dimensional tensor) in ", call,
                  ": pass the step's ", what, " on that rank (", stage == 0 ? "the first stage reads the inputs" :
                  "the last stage reads the targets", "); found on ", job_rank(me), ".");
      TORCH_CHECK(false, at_stage, ": the ", what, "' batch of ", rows_given, " rows does not split into ", m,
                  " micro-batches of equal size; use a batch divisible by ", m,
                  " or a number of micro-batches that divides the batch (found on ", job_rank(me), ").");
    }
    if (!training) return;  // eval() sums no tie's gradients
    for (size_t t = 0; t < cross_rank_ties.size(); ++t) {
      const int64_t at = ties_at + static_cast<int64_t>(t) * p;
      const std::string trained = ranks_with(at, kTrains), frozen = ranks_with(at, kFrozen);
      TORCH_CHECK(trained.empty() || frozen.empty(), "the tied weight ", cross_rank_ties[t], " is frozen "
                  "(requires_grad false) on pipeline rank(s) ", frozen, " but trained on rank(s) ", trained,
                  ": the unsplit model holds it as one tensor, trained or frozen; set its requires_grad alike on "
                  "every rank that holds it (found on rank ", me, ").");
    }
  }

  // Note [A tied weight's gradient over several steps]
  // The sum over a tie's holders is not idempotent as DDP's average is: summing the whole .grad at
  // each step counted what an earlier step() left there (gradient accumulation without zero_grad)
  // once more per holder (an audit, 2026-12-07). So a training step zeroes that gradient in place
  // (DDP's and FSDP's views of it stay valid), sums only its own, and adds the earlier one back:
  // earlier + (stage 0's + stage 1's), as one process accumulates. A step that throws gives the
  // earlier gradient back too, beside whatever of its own it got to (as a failed backward leaves).
  void set_aside_earlier_tie_gradients() {
    for (auto& tie : tie_sums) {
      tie.earlier = at::Tensor();
      if (!tie.stage->parameters().at(tie.index).requires_grad()) continue;  // frozen: not summed
      at::Tensor grad = tie.stage->parameters().at(tie.index).grad();
      tie.earlier = grad.defined() ? grad.clone() : at::Tensor();
      if (grad.defined()) grad.zero_();
    }
  }
  void add_back_earlier_tie_gradients() {
    for (auto& tie : tie_sums) {
      if (!tie.earlier.defined()) continue;
      at::Tensor parameter = tie.stage->parameters().at(tie.index);
      if (parameter.grad().defined()) {
        parameter.mutable_grad().add_(tie.earlier);
      } else {
        parameter.mutable_grad() = tie.earlier;
      }
      tie.earlier = at::Tensor();
    }
  }

  at::Tensor step(const at::Tensor& inputs, const at::Tensor& targets, bool train) {
    training = train;
    const c10::AutoGradMode grad_enabled(train);
    const auto started = std::chrono::steady_clock::now();
    stats = PipelineStepStats();
    // A step that threw leaves its passes behind; the next one starts clean (its neighbours,
    // which saw the same error, too).
    held.clear();
    batch.clear();
    recvs.clear();
    handed_activation.clear();
    handed_gradient.clear();
    sends.clear();
    shape_recv.clear();
    sent_shape.clear();
    check_batch(inputs, targets);
    // A rank without the last stage scales no loss, but its gradients are scaled all the same and
    // its scaler.step() unscales them: the scaler learns its scale's device here.
    if (scaler != nullptr && train) scaler->scale(at::zeros({}, at::TensorOptions().device(receive_device())));
    if (stages.count(0)) input_chunks = inputs.chunk(shape.microbatches, 0);
    if (stages.count(last_stage())) target_chunks = targets.chunk(shape.microbatches, 0);
    losses.assign(shape.microbatches, 0.0);
    for (const auto& [index, stage] : stages) {
      if (index > 0 && remote(index - 1)) {
        at::Tensor into = detail::shape_buffer();
        shape_recv[index] = {into, receive_shape(into, index)};
      }
    }
    if (train) set_aside_earlier_tie_gradients();
    const auto give_back_on_failure = c10::make_scope_exit([this] { add_back_earlier_tie_gradients(); });
    const auto& passes = train ? plan : eval_plan;
    // Zero bubble's weight passes are not in its plan: each runs where the rank would otherwise
    // wait for a message, or hold too many micro-batches, and those left after the last pass.
    std::deque<PipelinePass> weights_waiting;
    const int hold_limit = detail::weight_hold_limit(shape);
    // Where a weight pass falls depends on when messages arrive, which differs between the ranks
    // holding copies or tensor-parallel parts of a stage. Under FSDP a weight pass can gather a
    // released unit (a LayerNorm's backward takes its weight), and under sequence parallelism a
    // column-parallel weight's gradient all-gathers its input: collectives those ranks must issue in
    // the same order. There the weight passes wait only for the hold limit and the step's end, the
    // same on every rank of the stage.
    const bool timed_weight_passes = std::none_of(stages.begin(), stages.end(), [](const auto& entry) {
      return detail::stage_shard_group(*entry.second) != nullptr ||
             !tensor_parallel_splits(*entry.second->module()).empty();
    });
    auto run_weight_pass = [&] {
      PipelinePass weight = weights_waiting.front();
      weights_waiting.pop_front();
      weight.kind = PassKind::kBackwardWeight;
      backward_weight(weight);
      release_taken_sends();
    };
    const bool fused = fuse_receives(receive_device());
    const auto reduce_from = train ? last_backwards(passes) : std::map<size_t, PipelineStage*>();
    for (size_t i = 0; i < passes.size(); ++i) {
      // Posted ahead, unless its shape had not come then.
      post_receive(passes[i], /*blocking=*/true);
      post_batch();
      if (!fused && i + 1 < passes.size()) {
        post_receive(passes[i + 1], /*blocking=*/false);
        post_batch();
      }
      while (!weights_waiting.empty() &&
             detail::weight_pass_first(passes[i].kind == PassKind::kForward,
                                       !timed_weight_passes || message_arrived(passes[i]),
                                       static_cast<int>(held.size()), hold_limit)) {
        run_weight_pass();
      }
      switch (passes[i].kind) {
        case PassKind::kForward: forward(passes[i]); break;
        case PassKind::kBackward:
        case PassKind::kBackwardInput:
          if (auto last = reduce_from.find(i); last != reduce_from.end()) {
            if (auto* core = detail::data_parallel_core(*last->second)) core->begin_last_backward();
          }
          backward(passes[i]);
          break;
        case PassKind::kBackwardWeight: backward_weight(passes[i]); break;
      }
      if (passes[i].kind == PassKind::kBackwardInput) weights_waiting.push_back(passes[i]);
      if (fused && i + 1 < passes.size()) post_receive(passes[i + 1], /*blocking=*/false);
      post_batch();
      release_taken_sends();
    }
    while (!weights_waiting.empty()) run_weight_pass();
    for (auto& sent : sends) {
      wait(sent.work, sent.from_stage,
           "stage " + std::to_string(sent.to_stage) + " (rank " + std::to_string(rank_of(sent.to_stage)) +
               ") to take a message");
    }
    TORCH_INTERNAL_ASSERT(held.empty() && recvs.empty() && handed_activation.empty() && handed_gradient.empty(),
                          "pipeline: a step ended with passes left over");
    // Each copy of a tied weight got its own stage's gradient: their sum is the unsplit model's.
    // Only this step's: what earlier steps left (accumulation without zero_grad) was summed then.
    if (train) {
      finalize_data_parallel();
      for (auto& tie : tie_sums) {
        at::Tensor parameter = tie.stage->parameters().at(tie.index);
        // A frozen tie gets no gradient, as the unsplit model's frozen tensor: a zero one made here
        // was stepped by an optimizer over every parameter (AdamW's weight decay moved it). Its
        // holders agreed on requires_grad at the step's start (Note [A step's opening exchange]).
        if (!parameter.requires_grad()) continue;
        if (!parameter.grad().defined()) parameter.mutable_grad() = at::zeros_like(parameter);
        all_reduce(tie.holders, parameter.mutable_grad());
      }
      add_back_earlier_tie_gradients();
    }
    sends.clear();
    shape_recv.clear();
    sent_shape.clear();
    input_chunks.clear();
    target_chunks.clear();
    // The last stage's losses reach every rank, for logging and early stopping alike.
    at::Tensor all = at::tensor(losses, at::kDouble);
    // Timed as waiting: the last stage, done first, idles here until the others finish.
    const auto broadcast_started = std::chrono::steady_clock::now();
    broadcast(group, all, rank_of(last_stage()));
    stats.waiting_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - broadcast_started).count();
    losses.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
    at::Tensor mean = all.mean();
    if (auto pipelines = loss_group(); pipelines && pipelines->size() > 1) all_reduce(*pipelines, mean, ReduceOp::kAvg);
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return mean;
  }
};

PipelineSchedule::PipelineSchedule(std::vector<PipelineStage*> stages, int microbatches, LossFn loss, Order order)
    : runtime_(std::make_unique<Runtime>(group_of(stages))) {
  auto& rt = *runtime_;
  switch (order) {
    case Order::kGPipe: rt.kind = detail::ScheduleKind::kGPipe; break;
    case Order::k1F1B: rt.kind = detail::ScheduleKind::k1F1B; break;
    case Order::kInterleaved1F1B: rt.kind = detail::ScheduleKind::kInterleaved1F1B; break;
    case Order::kZeroBubble: rt.kind = detail::ScheduleKind::kZeroBubble; break;
    case Order::kLoopedBFS: rt.kind = detail::ScheduleKind::kLoopedBFS; break;
  }
  const char* kind = detail::to_string(rt.kind);
  const int p = rt.group.size();
  const int num_stages = stages[0]->num_stages();
  rt.shape = {p, num_stages / p, microbatches};
  // This rank's own checks, refused on every rank by the exchange.
  const auto refused = refuse_locally(rt.kind, rt.shape, stages, loss != nullptr, rt.group.rank());
  agree_on_schedule(rt.group, kind, refused ? refused_schedule(*refused) : schedule_text(kind, stages, microbatches));
  for (auto* stage : stages) {
    rt.stages.emplace(stage->index(), stage);
    if (!rt.device) {
      for (const auto& param : stage->module()->parameters()) {  // not an offloaded FSDP shard's
        rt.device = param.device();
        break;
      }
    }
  }
  // Ties across ranks: one group per set of ranks holding one. Every rank finds the same ties in
  // the same order, so the groups are made alike (new_group is collective over the pipeline).
  const detail::StageTies& ties = *stages[0]->ties_;
  std::map<std::vector<int>, ProcessGroup> holders_of;
  for (size_t t = 0; t < ties.ties.size(); ++t) {
    std::vector<int> ranks;
    for (int s : ties.ties[t].stages) ranks.push_back(rt.shape.rank_of(s));
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    if (ranks.size() < 2) continue;  // one rank's stages share the tensor itself
    rt.cross_rank_ties.push_back(ties.ties[t].description);
    auto found = holders_of.find(ranks);
    if (found == holders_of.end()) found = holders_of.emplace(ranks, new_group(rt.group, ranks)).first;
    if (!found->second.is_member()) continue;
    for (auto* stage : stages) {
      const auto& tie_of = ties.tie_of.at(stage->index());
      auto at = std::find(tie_of.begin(), tie_of.end(), static_cast<int>(t));
      if (at == tie_of.end()) continue;
      rt.tie_sums.push_back({stage, static_cast<size_t>(at - tie_of.begin()), found->second,
                             rt.cross_rank_ties.size() - 1, at::Tensor()});
      break;
    }
  }
  rt.plan = detail::plan_rank(rt.kind, rt.shape, rt.group.rank());
  // Forward passes wait only for lower stages of the same micro-batch or earlier ones: in this
  // order no two ranks wait for each other.
  for (int mb = 0; mb < microbatches; ++mb) {
    for (const auto& [index, stage] : rt.stages) rt.eval_plan.push_back({PassKind::kForward, index, mb});
  }
  rt.loss_fn = std::move(loss);
}

PipelineSchedule::~PipelineSchedule() = default;

at::Tensor PipelineSchedule::step(const at::Tensor& inputs, const at::Tensor& targets) {
  detail::PublicCallScope call("PipelineSchedule::step");
  return runtime_->step(inputs, targets, /*train=*/true);
}
void PipelineSchedule::set_data_parallel_group(const ProcessGroup& group) {
  detail::check_member("PipelineSchedule::set_data_parallel_group", group);
  TORCH_CHECK(!runtime_->data_parallel, "PipelineSchedule::set_data_parallel_group: already set; call it once.");
  // One mechanism for data parallelism in stages: each stage in DDP (in stage order, the same on
  // every rank of the group). A stage with nothing to train has nothing to reduce; its loss is
  // still averaged over `group`.
  for (auto& [index, stage] : runtime_->stages) {
    const auto params = stage->parameters();
    const bool trains = std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); });
    if (trains && stage->data_parallel().is_empty()) stage->set_data_parallel(DistributedDataParallel(stage->module(), group));
  }
  runtime_->data_parallel = group;
}
void PipelineSchedule::set_grad_scaler(GradScaler& scaler) { runtime_->scaler = &scaler; }
void PipelineSchedule::set_scale_grads(bool scale) { runtime_->scale_grads = scale; }
at::Tensor PipelineSchedule::eval(const at::Tensor& inputs, const at::Tensor& targets) {
  detail::PublicCallScope call("PipelineSchedule::eval");
  return runtime_->step(inputs, targets, /*train=*/false);
}
const std::vector<double>& PipelineSchedule::microbatch_losses() const { return runtime_->losses; }
const PipelineStepStats& PipelineSchedule::last_step_stats() const { return runtime_->stats; }
int PipelineSchedule::microbatches() const { return runtime_->shape.microbatches; }

ScheduleGPipe::ScheduleGPipe(PipelineStage& stage, int microbatches, LossFn loss)
    : PipelineSchedule({&stage}, microbatches, std::move(loss), Order::kGPipe) {}
Schedule1F1B::Schedule1F1B(PipelineStage& stage, int microbatches, LossFn loss)
    : PipelineSchedule({&stage}, microbatches, std::move(loss), Order::k1F1B) {}
ScheduleZeroBubble::ScheduleZeroBubble(PipelineStage& stage, int microbatches, LossFn loss)
    : PipelineSchedule({&stage}, microbatches, std::move(loss), Order::kZeroBubble) {}
ScheduleInterleaved1F1B::ScheduleInterleaved1F1B(std::vector<PipelineStage*> stages, int microbatches, LossFn loss)
    : PipelineSchedule(std::move(stages), microbatches, std::move(loss), Order::kInterleaved1F1B) {}
ScheduleLoopedBFS::ScheduleLoopedBFS(std::vector<PipelineStage*> stages, int microbatches, LossFn loss)
    : PipelineSchedule(std::move(stages), microbatches, std::move(loss), Order::kLoopedBFS) {}

std::unique_ptr<PipelineSchedule> make_schedule(const std::string& name, std::vector<PipelineStage*> stages,
                                                int microbatches, PipelineSchedule::LossFn loss) {
  TORCH_CHECK(!stages.empty() && stages[0] != nullptr, "cpprun::make_schedule(\"", name, "\"): no stage given.");
  // A refusal here still reaches the schedule's exchange, as the constructor's own checks do, so
  // that the ranks given a good name do not wait there (Note [One schedule on every pipeline rank]).
  const ProcessGroup& group = stages[0]->group();
  const auto kind = detail::schedule_kind_named(name);
  if (!kind) {
    constexpr const char* kSchedules =
        "the schedules are gpipe, 1f1b, interleaved-1f1b, looped-bfs and zero-bubble (PyTorch's GPipe, 1F1B, "
        "Interleaved1F1B, LoopedBFS; ScheduleZeroBubble is after ZB-H1, PyTorch's InterleavedZeroBubble with one "
        "stage per rank).";
    const auto pytorch = detail::pytorch_schedule_not_here(name);
    if (pytorch) {
      refuse_on_every_rank(group, "cpprun::make_schedule(\"" + name + "\"): PyTorch's " + *pytorch +
                                      " is not implemented in cpprun; " + kSchedules);
    }
    refuse_on_every_rank(group, "cpprun::make_schedule: no schedule is named \"" + name + "\"; " + kSchedules);
  }
  if (*kind == detail::ScheduleKind::kInterleaved1F1B) {
    return std::make_unique<ScheduleInterleaved1F1B>(std::move(stages), microbatches, std::move(loss));
  }
  if (*kind == detail::ScheduleKind::kLoopedBFS) {
    return std::make_unique<ScheduleLoopedBFS>(std::move(stages), microbatches, std::move(loss));
  }
  if (stages.size() != 1) {
    refuse_on_every_rank(group, "cpprun::make_schedule(\"" + name + "\"): " + detail::to_string(*kind) +
                                    " runs one stage per rank, but " + std::to_string(stages.size()) + " were given; "
                                    "use interleaved-1f1b (or looped-bfs) for several stages per rank.");
  }
  PipelineStage& stage = *stages[0];
  switch (*kind) {
    case detail::ScheduleKind::kGPipe: return std::make_unique<ScheduleGPipe>(stage, microbatches, std::move(loss));
    case detail::ScheduleKind::k1F1B: return std::make_unique<Schedule1F1B>(stage, microbatches, std::move(loss));
    case detail::ScheduleKind::kZeroBubble:
      return std::make_unique<ScheduleZeroBubble>(stage, microbatches, std::move(loss));
    case detail::ScheduleKind::kInterleaved1F1B:
    case detail::ScheduleKind::kLoopedBFS: break;  // above
  }
  TORCH_INTERNAL_ASSERT(false, "make_schedule: unhandled schedule kind");
}

}  // namespace cpprun
