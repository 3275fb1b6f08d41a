// Pipeline schedules as plans: for each rank of the pipeline, the ordered list of forward and
// backward passes (stage, micro-batch) it runs in one training step. Pure decisions, no tensors
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

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B };
const char* to_string(ScheduleKind kind);

enum class PassKind { kForward, kBackward };

struct PipelinePass {
  PassKind kind;
  int stage;
  int microbatch;
  bool operator==(const PipelinePass& other) const {
    return kind == other.kind && stage == other.stage && microbatch == other.microbatch;
  }
};
std::string to_string(const PipelinePass& pass);  // "F3@s1" / "B3@s1"

struct PipelineShape {
  int ranks = 1;
  int stages_per_rank = 1;  // > 1: virtual stages (interleaved schedules only)
  int microbatches = 1;
  int stages() const { return ranks * stages_per_rank; }
  int rank_of(int stage) const { return stage % ranks; }
};

// Why `kind` cannot run `shape` (a message naming the numbers and the fix), or nothing.
std::optional<std::string> refuse_shape(ScheduleKind kind, const PipelineShape& shape);

// The passes rank `rank` runs in one step, in order. The shape must pass refuse_shape.
//  - GPipe: every forward, then every backward (all micro-batches' activations held at once).
//  - 1F1B: rank r runs min(p - r - 1, m) forwards, then alternates one forward and one backward,
//    then the remaining backwards: at most p - r micro-batches in flight.
//  - Interleaved 1F1B (Megatron-LM's): forwards walk the rank's stages in rounds of p
//    micro-batches, backwards the same rounds with the stages reversed; warm-up
//    (p - r - 1) * 2 + (v - 1) * p forwards.
std::vector<PipelinePass> plan_rank(ScheduleKind kind, const PipelineShape& shape, int rank);

// Runs every rank's plan against the others as the runtime does (a send never blocks, a receive
// waits for its message; a pass whose neighbour stage is on the same rank hands over in memory)
// and counts time in slots: a forward takes `forward_cost`, a backward `backward_cost`, messages
// are free. Returns the deadlock (which ranks wait for what) or the step's length.
struct Simulation {
  std::optional<std::string> deadlock;
  double makespan = 0;          // slots until the last rank finishes
  double busy_per_rank = 0;     // the work each rank does: m * v * (forward + backward cost)
  std::vector<int> peak_in_flight;  // per rank: most micro-batch activations held at once
  double bubble_fraction() const { return makespan > 0 ? 1.0 - busy_per_rank / makespan : 0.0; }
};
Simulation simulate(const PipelineShape& shape, const std::vector<std::vector<PipelinePass>>& plans,
                    double forward_cost = 1.0, double backward_cost = 2.0);

}  // namespace cpprun::detail
