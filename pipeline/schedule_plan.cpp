// See schedule_plan.h.
#include "pipeline/schedule_plan.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace cpprun::detail {

const char* to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "GPipe";
    case ScheduleKind::k1F1B: return "1F1B";
    case ScheduleKind::kInterleaved1F1B: return "Interleaved1F1B";
    case ScheduleKind::kZeroBubble: return "ZeroBubble";
    case ScheduleKind::kLoopedBFS: return "LoopedBFS";
  }
  return "?";
}

namespace {

// A schedule's name as compared: lower case, without '-', '_' and a leading "schedule".
std::string folded_schedule_name(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (out.rfind("schedule", 0) == 0 && out != "schedule") out.erase(0, 8);
  return out;
}

}  // namespace

std::optional<ScheduleKind> schedule_kind_named(const std::string& name) {
  const std::string wanted = folded_schedule_name(name);
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                                  ScheduleKind::kZeroBubble, ScheduleKind::kLoopedBFS}) {
    if (folded_schedule_name(to_string(kind)) == wanted) return kind;
  }
  // PyTorch's ScheduleInterleavedZeroBubble with one stage per rank is ZB-H1, cpprun's zero bubble;
  // with several, make_schedule refuses as for any one-stage schedule.
  if (wanted == "interleavedzerobubble") return ScheduleKind::kZeroBubble;
  return std::nullopt;
}

std::optional<std::string> pytorch_schedule_not_here(const std::string& name) {
  const std::string wanted = folded_schedule_name(name);
  for (const char* known :
       {"ScheduleZBVZeroBubble", "ScheduleDualPipeV", "PipelineScheduleSingle", "PipelineScheduleMulti"}) {
    if (folded_schedule_name(known) == wanted) return std::string(known);
  }
  return std::nullopt;
}

std::string to_string(const PipelinePass& pass) {
  const char* letter = pass.kind == PassKind::kForward         ? "F"
                       : pass.kind == PassKind::kBackward      ? "B"
                       : pass.kind == PassKind::kBackwardInput ? "I"
                                                               : "W";
  return letter + std::to_string(pass.microbatch) + "@s" + std::to_string(pass.stage);
}

std::optional<std::string> refuse_shape(ScheduleKind kind, const PipelineShape& shape) {
  std::ostringstream why;
  if (shape.ranks < 1 || shape.stages_per_rank < 1) {
    why << "a pipeline needs at least one rank and one stage per rank (got " << shape.ranks << " ranks, "
        << shape.stages_per_rank << " stages per rank).";
    return why.str();
  }
  if (shape.microbatches < 1) {
    why << to_string(kind) << " needs at least one micro-batch per step (got " << shape.microbatches << ").";
    return why.str();
  }
  const bool several_stages = kind == ScheduleKind::kInterleaved1F1B || kind == ScheduleKind::kLoopedBFS;
  if (!several_stages && shape.stages_per_rank != 1) {
    why << to_string(kind) << " runs one stage per rank, but this rank holds " << shape.stages_per_rank
        << " stages; use Interleaved1F1B (or LoopedBFS) for several stages per rank, or split the model into as many "
           "stages as there are pipeline ranks ("
        << shape.ranks << ").";
    return why.str();
  }
  if (kind == ScheduleKind::kInterleaved1F1B && shape.microbatches % interleaved_rounds(shape) != 0) {
    // Its rounds take the same number of micro-batches through each of a rank's stages in turn: a
    // partial round would leave a stage waiting for a micro-batch that never comes. PyTorch's
    // ScheduleInterleaved1F1B asks the same (rounds = max(1, m / p)).
    const int rounds = interleaved_rounds(shape);
    // The nearest counts below and above that it runs (each has rounds of its own).
    const auto runs = [&](int m) { return m >= 1 && m % interleaved_rounds({shape.ranks, shape.stages_per_rank, m}) == 0; };
    int below = shape.microbatches - 1, above = shape.microbatches + 1;
    while (!runs(below)) --below;
    while (!runs(above)) ++above;
    why << "Interleaved1F1B runs micro-batches in " << rounds << " rounds of equal size (max(1, micro-batches / "
        << "pipeline ranks), as PyTorch's): " << shape.microbatches << " micro-batches is not a multiple of "
        << rounds << "; use " << below << " or " << above << ", or Schedule1F1B.";
    return why.str();
  }
  return std::nullopt;
}

namespace {

std::vector<PipelinePass> one_f_one_b(int stage, int warmup, int microbatches) {
  std::vector<PipelinePass> passes;
  for (int mb = 0; mb < warmup; ++mb) passes.push_back({PassKind::kForward, stage, mb});
  for (int i = 0; i < microbatches - warmup; ++i) {
    passes.push_back({PassKind::kForward, stage, warmup + i});
    passes.push_back({PassKind::kBackward, stage, i});
  }
  for (int mb = microbatches - warmup; mb < microbatches; ++mb) passes.push_back({PassKind::kBackward, stage, mb});
  return passes;
}

// Megatron-LM's interleaved order, in rounds of r = m / rounds micro-batches (p when p divides
// m; PyTorch's flexible rounds otherwise): the k-th forward (or backward) of a rank runs
// micro-batch k % r of its round on the stage chunk (k / r) % v.
PipelinePass interleaved_pass(PassKind kind, const PipelineShape& shape, int rank, int k) {
  const int p = shape.ranks, v = shape.stages_per_rank;
  const int per_round = shape.microbatches / interleaved_rounds(shape);
  const int round_position = k % (per_round * v);
  int chunk = round_position / per_round;
  if (kind == PassKind::kBackward) chunk = v - 1 - chunk;
  const int microbatch = (k / (per_round * v)) * per_round + k % per_round;
  return {kind, chunk * p + rank, microbatch};
}

}  // namespace

bool weight_pass_first(bool next_is_forward, bool next_ready, int held, int hold_limit) {
  return !next_ready || (next_is_forward && held >= hold_limit);
}

int weight_hold_limit(const PipelineShape& shape) { return std::min(shape.ranks, shape.microbatches); }

std::vector<PipelinePass> plan_rank(ScheduleKind kind, const PipelineShape& shape, int rank) {
  const int p = shape.ranks, m = shape.microbatches;
  switch (kind) {
    case ScheduleKind::kGPipe: return one_f_one_b(rank, m, m);
    case ScheduleKind::k1F1B: return one_f_one_b(rank, std::min(p - rank - 1, m), m);
    case ScheduleKind::kInterleaved1F1B: {
      const int total = m * shape.stages_per_rank;
      const int per_round = m / interleaved_rounds(shape);
      // With as many micro-batches as ranks there is no steady state: every forward first.
      const int warmup =
          m == p ? total : std::min(total, (p - rank - 1) * 2 + (shape.stages_per_rank - 1) * per_round);
      std::vector<PipelinePass> passes;
      for (int k = 0; k < warmup; ++k) passes.push_back(interleaved_pass(PassKind::kForward, shape, rank, k));
      for (int i = 0; i < total - warmup; ++i) {
        passes.push_back(interleaved_pass(PassKind::kForward, shape, rank, warmup + i));
        passes.push_back(interleaved_pass(PassKind::kBackward, shape, rank, i));
      }
      for (int k = total - warmup; k < total; ++k) passes.push_back(interleaved_pass(PassKind::kBackward, shape, rank, k));
      return passes;
    }
    case ScheduleKind::kZeroBubble: {
      auto passes = one_f_one_b(rank, std::min(p - rank - 1, m), m);
      for (auto& pass : passes) {
        if (pass.kind == PassKind::kBackward) pass.kind = PassKind::kBackwardInput;
      }
      return passes;
    }
    case ScheduleKind::kLoopedBFS: {
      const int v = shape.stages_per_rank;
      std::vector<PipelinePass> passes;
      for (int chunk = 0; chunk < v; ++chunk) {
        for (int mb = 0; mb < m; ++mb) passes.push_back({PassKind::kForward, chunk * p + rank, mb});
      }
      // As PyTorch's: the micro-batches reversed too, so that the last stage starts with the
      // micro-batch whose forward it ran last and each stage below receives in that order.
      for (int chunk = v - 1; chunk >= 0; --chunk) {
        for (int mb = m - 1; mb >= 0; --mb) passes.push_back({PassKind::kBackward, chunk * p + rank, mb});
      }
      return passes;
    }
  }
  return {};
}

Simulation simulate(const PipelineShape& shape, const std::vector<std::vector<PipelinePass>>& plans,
                    double forward_cost, double backward_cost, double weight_share, bool weight_passes_run_as_needed) {
  Simulation result;
  const int p = shape.ranks, last = shape.stages() - 1;
  result.busy_per_rank = shape.microbatches * shape.stages_per_rank * (forward_cost + backward_cost);
  result.peak_in_flight.assign(p, 0);
  if (static_cast<int>(plans.size()) != p) {
    result.deadlock = "expected one plan per rank";
    return result;
  }
  auto cost_of = [&](PassKind kind) {
    switch (kind) {
      case PassKind::kForward: return forward_cost;
      case PassKind::kBackward: return backward_cost;
      case PassKind::kBackwardInput: return backward_cost * (1 - weight_share);
      case PassKind::kBackwardWeight: return backward_cost * weight_share;
    }
    return 0.0;
  };
  // When each pass of a (stage, micro-batch) is done; a stage's input gradient is ready when its
  // kBackward or kBackwardInput is (keyed as kBackward).
  auto done_key = [](PassKind kind, int stage, int microbatch) {
    return std::make_tuple(kind == PassKind::kBackwardInput ? PassKind::kBackward : kind, stage, microbatch);
  };
  std::map<std::tuple<PassKind, int, int>, double> done_at;
  std::map<std::tuple<PassKind, int, int>, int> runs;  // each (kind, stage, micro-batch): once
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> in_flight(p, 0);
  std::vector<std::deque<PipelinePass>> weights_waiting(p);  // weight_passes_run_as_needed: oldest first
  const int hold_limit = weight_hold_limit(shape);
  auto run_weight_pass = [&](int r) {
    PipelinePass weight = weights_waiting[r].front();
    weights_waiting[r].pop_front();
    weight.kind = PassKind::kBackwardWeight;
    ++runs[std::make_tuple(weight.kind, weight.stage, weight.microbatch)];
    clock[r] += cost_of(weight.kind);
    --in_flight[r];
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < plans[r].size() || !weights_waiting[r].empty()) {
        if (next[r] == plans[r].size()) {  // the plan done: the weight passes left
          run_weight_pass(r);
          progressed = true;
          continue;
        }
        const PipelinePass& pass = plans[r][next[r]];
        if (shape.rank_of(pass.stage) != r) {
          result.deadlock = "rank " + std::to_string(r) + "'s plan runs " + to_string(pass) + " of another rank";
          return result;
        }
        if (pass.microbatch < 0 || pass.microbatch >= shape.microbatches) {
          result.deadlock = "rank " + std::to_string(r) + "'s plan runs " + to_string(pass) + ", of a micro-batch that does not exist";
          return result;
        }
        const bool backward = pass.kind != PassKind::kForward;
        // A backward needs this stage's own forward of the micro-batch, even where it waits for a
        // gradient, and a weight pass its input pass: a plan that runs them the other way round is wrong.
        if (backward && !done_at.count({PassKind::kForward, pass.stage, pass.microbatch})) {
          result.deadlock = "rank " + std::to_string(r) + " runs " + to_string(pass) + " before its forward";
          return result;
        }
        if (pass.kind == PassKind::kBackwardWeight &&
            !runs.count({PassKind::kBackwardInput, pass.stage, pass.microbatch})) {
          result.deadlock = "rank " + std::to_string(r) + " runs " + to_string(pass) + " before its input pass";
          return result;
        }
        std::optional<std::tuple<PassKind, int, int>> needs;
        if (pass.kind == PassKind::kForward) {
          if (pass.stage > 0) needs = std::make_tuple(PassKind::kForward, pass.stage - 1, pass.microbatch);
        } else if (pass.kind != PassKind::kBackwardWeight) {
          if (pass.stage == last) needs = std::make_tuple(PassKind::kForward, pass.stage, pass.microbatch);
          else needs = std::make_tuple(PassKind::kBackward, pass.stage + 1, pass.microbatch);
        }
        double ready = 0;
        if (needs) {
          auto it = done_at.find(*needs);
          if (it == done_at.end()) break;  // a receive that waits
          ready = it->second;
        }
        if (!weights_waiting[r].empty() &&
            weight_pass_first(pass.kind == PassKind::kForward, ready <= clock[r], in_flight[r], hold_limit)) {
          run_weight_pass(r);
          progressed = true;
          continue;
        }
        if (runs[std::make_tuple(pass.kind, pass.stage, pass.microbatch)]++ > 0 ||
            (pass.kind != PassKind::kForward && pass.kind != PassKind::kBackwardWeight &&
             done_at.count(done_key(pass.kind, pass.stage, pass.microbatch)))) {
          result.deadlock = "rank " + std::to_string(r) + " runs " + to_string(pass) + " twice";
          return result;
        }
        const double start = std::max(clock[r], ready);
        clock[r] = start + cost_of(pass.kind);
        done_at[done_key(pass.kind, pass.stage, pass.microbatch)] = clock[r];
        if (pass.kind == PassKind::kForward) ++in_flight[r];
        if (pass.kind == PassKind::kBackward || pass.kind == PassKind::kBackwardWeight) --in_flight[r];
        if (pass.kind == PassKind::kBackwardInput && weight_passes_run_as_needed) weights_waiting[r].push_back(pass);
        result.peak_in_flight[r] = std::max(result.peak_in_flight[r], in_flight[r]);
        ++next[r];
        progressed = true;
      }
    }
  }
  std::ostringstream waiting;
  for (int r = 0; r < p; ++r) {
    if (next[r] < plans[r].size()) waiting << (waiting.tellp() > 0 ? "; " : "") << "rank " << r << " waits in " << to_string(plans[r][next[r]]);
  }
  if (waiting.tellp() > 0) {
    result.deadlock = waiting.str();
    return result;
  }
  // Each stage's micro-batch: one forward, and one backward, whole or as both of its parts.
  for (int r = 0; r < p; ++r) {
    for (int v = 0; v < shape.stages_per_rank; ++v) {
      const int stage = v * p + r;
      for (int mb = 0; mb < shape.microbatches; ++mb) {
        auto count = [&](PassKind kind) {
          auto it = runs.find({kind, stage, mb});
          return it == runs.end() ? 0 : it->second;
        };
        const int whole = count(PassKind::kBackward), input = count(PassKind::kBackwardInput),
                  weight = count(PassKind::kBackwardWeight);
        if (count(PassKind::kForward) != 1 || whole + input != 1 || input != weight) {
          result.deadlock = "rank " + std::to_string(r) + "'s plan does not run each of its passes once (stage " +
                            std::to_string(stage) + ", micro-batch " + std::to_string(mb) + ")";
          return result;
        }
      }
    }
    if (in_flight[r] != 0) {
      result.deadlock = "rank " + std::to_string(r) + "'s plan does not run each of its passes once";
      return result;
    }
    result.makespan = std::max(result.makespan, clock[r]);
  }
  return result;
}

}  // namespace cpprun::detail
