// Pipeline schedules as plans: for each rank of the pipeline, the ordered list of forward and
// backward passes (stage, micro-batch) it runs in one training step (zero-bubble schedules split
// a backward in two: the input's gradient, then later the weights'). Pure decisions, no tensors
// and no messages, so that every schedule is checked without processes (simulate() runs all ranks'
// plans against each other); schedule_runtime.cpp carries a plan out.
//
// Stages are numbered 0 .. stages_per_rank * ranks - 1 in model order; stage s lives on rank
// s % ranks (with one stage per rank, stage r on rank r; interleaved, rank r holds r, r + p, ...).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cpprun::detail {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubble, kLoopedBFS };
const char* to_string(ScheduleKind kind);
// The kind `name` names: to_string's ("Interleaved1F1B") or a flag's ("interleaved-1f1b"), case,
// '-' and '_' aside, "Schedule" before it allowed (PyTorch's class names); else none. PyTorch's
// "InterleavedZeroBubble" names kZeroBubble, whose one stage per rank is what cpprun runs of it.
std::optional<ScheduleKind> schedule_kind_named(const std::string& name);
// For a name PyTorch's get_schedule_class knows and cpprun has no schedule for (ZBVZeroBubble,
// DualPipeV, the abstract PipelineScheduleSingle / Multi): PyTorch's class name,
// so that the refusal says it is a real schedule not built here rather than a misspelling.
std::optional<std::string> pytorch_schedule_not_here(const std::string& name);

// kBackward: the whole backward (input and weight gradients). Zero-bubble schedules run it as
// kBackwardInput (the input's gradient, which the previous stage waits for) and, later,
// kBackwardWeight (the weights' gradients, which nobody waits for: they fill what would idle).
// PyTorch's letters: F, B, I, W.
enum class PassKind { kForward, kBackward, kBackwardInput, kBackwardWeight };

struct PipelinePass {
  PassKind kind;
  int stage;
  int microbatch;
  bool operator==(const PipelinePass& other) const {
    return kind == other.kind && stage == other.stage && microbatch == other.microbatch;
  }
};
std::string to_string(const PipelinePass& pass);  // "F3@s1" / "B3@s1" / "I3@s1" / "W3@s1"

struct PipelineShape {
  int ranks = 1;
  int stages_per_rank = 1;  // > 1: virtual stages (Interleaved 1F1B and LoopedBFS only)
  int microbatches = 1;
  int stages() const { return ranks * stages_per_rank; }
  int rank_of(int stage) const { return stage % ranks; }
};

// Interleaved 1F1B's rounds: max(1, m / p), as PyTorch's ScheduleInterleaved1F1B; each takes
// m / rounds micro-batches through every stage of a rank (p of them when p divides m), so the
// rounds must divide m.
inline int interleaved_rounds(const PipelineShape& shape) {
  return shape.microbatches / shape.ranks > 1 ? shape.microbatches / shape.ranks : 1;
}

// Why `kind` cannot run `shape` (a message naming the numbers and the fix), or nothing.
std::optional<std::string> refuse_shape(ScheduleKind kind, const PipelineShape& shape);

// The passes rank `rank` runs in one step, in order. The shape must pass refuse_shape.
//  - GPipe: every forward, then every backward (all micro-batches' activations held at once).
//  - 1F1B: rank r runs min(p - r - 1, m) forwards, then alternates one forward and one backward,
//    then the remaining backwards: at most p - r micro-batches in flight.
//  - Interleaved 1F1B (Megatron-LM's): forwards walk the rank's stages in rounds of r = m /
//    interleaved_rounds micro-batches (p when p divides m), backwards the same rounds with the
//    stages reversed; warm-up (p - r - 1) * 2 + (v - 1) * r forwards (every one when m = p).
//  - Zero bubble (after ZB-H1, Qi et al., "Zero Bubble Pipeline Parallelism", 2024): 1F1B's
//    order with each backward's input pass (kBackwardInput) in its place; its weight passes are
//    not in the plan: the rank runs them where it would otherwise wait (weight_pass_first).
//  - LoopedBFS (PyTorch's ScheduleLoopedBFS): GPipe looped over the rank's stages, breadth
//    first: every micro-batch's forward through its first stage, then its next; then the
//    backwards, the stages reversed and the micro-batches too (the last forward's first). All
//    m * v micro-batch activations are held at once; with m >= p, interleaved's bubble.
std::vector<PipelinePass> plan_rank(ScheduleKind kind, const PipelineShape& shape, int rank);

// Zero bubble's weight passes, run as the rank goes rather than planned, so that they fill the
// waits whatever the passes really cost: before its next pass a rank runs its oldest waiting
// weight pass (if it has one) when that pass would wait for a message (!next_ready), or is a
// forward that would make it hold more than `hold_limit` micro-batches (a micro-batch is held from
// its forward until its weight pass); and after its last pass, all that are left. hold_limit:
// min(p, m), what 1F1B's first rank holds.
bool weight_pass_first(bool next_is_forward, bool next_ready, int held, int hold_limit);
int weight_hold_limit(const PipelineShape& shape);

// Runs every rank's plan against the others as the runtime does (a send never blocks, a receive
// waits for its message; a pass whose neighbour stage is on the same rank hands over in memory)
// and counts time in slots: a forward takes `forward_cost`, a backward `backward_cost` (split: its
// input part `backward_cost * (1 - weight_share)`, its weight part the rest), messages are free.
// Returns the deadlock (which ranks wait for what) or the step's length. A micro-batch is held
// from its forward until its backward (split: until its weight part). weight_passes_run_as_needed:
// the plans' input passes have no weight passes in the plan; they run by weight_pass_first.
struct Simulation {
  std::optional<std::string> deadlock;
  double makespan = 0;          // slots until the last rank finishes
  double busy_per_rank = 0;     // the work each rank does: m * v * (forward + backward cost)
  std::vector<int> peak_in_flight;  // per rank: most micro-batch activations held at once
  double bubble_fraction() const { return makespan > 0 ? 1.0 - busy_per_rank / makespan : 0.0; }
};
Simulation simulate(const PipelineShape& shape, const std::vector<std::vector<PipelinePass>>& plans,
                    double forward_cost = 1.0, double backward_cost = 2.0, double weight_share = 0.5,
                    bool weight_passes_run_as_needed = false);

}  // namespace cpprun::detail
