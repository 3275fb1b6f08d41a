// Pipeline schedules and splits as pure decisions (pipeline/schedule_plan.h, stage_split.h): every
// schedule's plans, run against each other by the simulator, finish without a deadlock for every
// shape up to 6 ranks, 3 stages per rank and 12 micro-batches; 1F1B holds at most p - r
// micro-batches on rank r where GPipe holds them all; the bubbles and interleaved's memory match
// their formulas; zero bubble reaches ZB-H1's bubble, holds no more than 1F1B's first rank and
// idles less than 1F1B whatever its weight passes cost; a plan
// broken on purpose is caught; every mistake in a split is refused by name; and a stage's
// checkpoint names follow its prefixes, the longest first, whole components only.
#include "catch.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipeline/schedule_plan.h"
#include "pipeline/stage_messages.h"
#include "pipeline/stage_names.h"
#include "pipeline/stage_split.h"
#include "pipeline/tied_parameters.h"

namespace {

using cpprun::detail::PassKind;
using cpprun::detail::PipelinePass;
using cpprun::detail::PipelineShape;
using cpprun::detail::ScheduleKind;

std::vector<std::vector<PipelinePass>> plans_of(ScheduleKind kind, const PipelineShape& shape) {
  std::vector<std::vector<PipelinePass>> plans;
  for (int r = 0; r < shape.ranks; ++r) plans.push_back(cpprun::detail::plan_rank(kind, shape, r));
  return plans;
}

std::string error_of(const std::vector<std::string>& children, const std::vector<std::vector<std::string>>& split,
                     int ranks) {
  try {
    cpprun::detail::check_split(children, split, ranks);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST_CASE("pipeline plan: every schedule runs every pass once, without a deadlock", "[pipeline]") {
  int shapes = 0;
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubble}) {
        const PipelineShape shape{p, 1, m};
        REQUIRE_FALSE(cpprun::detail::refuse_shape(kind, shape));
        const auto run = cpprun::detail::simulate(shape, plans_of(kind, shape), 1.0, 2.0, 0.5,
                                                  /*weight_passes_run_as_needed=*/kind == ScheduleKind::kZeroBubble);
        INFO(cpprun::detail::to_string(kind) << " p=" << p << " m=" << m << ": " << run.deadlock.value_or(""));
        CHECK_FALSE(run.deadlock);
        ++shapes;
      }
      for (int v = 1; v <= 3; ++v) {
        const PipelineShape shape{p, v, m};
        if (cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, shape)) {
          CHECK(m % std::max(1, m / p) != 0);  // the one shape it refuses, as PyTorch
          continue;
        }
        const auto run = cpprun::detail::simulate(shape, plans_of(ScheduleKind::kInterleaved1F1B, shape));
        INFO("interleaved p=" << p << " v=" << v << " m=" << m << ": " << run.deadlock.value_or(""));
        CHECK_FALSE(run.deadlock);
        ++shapes;
      }
      for (int v = 1; v <= 3; ++v) {  // LoopedBFS takes any m
        const PipelineShape shape{p, v, m};
        REQUIRE_FALSE(cpprun::detail::refuse_shape(ScheduleKind::kLoopedBFS, shape));
        const auto run = cpprun::detail::simulate(shape, plans_of(ScheduleKind::kLoopedBFS, shape));
        INFO("LoopedBFS p=" << p << " v=" << v << " m=" << m << ": " << run.deadlock.value_or(""));
        CHECK_FALSE(run.deadlock);
        for (int r = 0; r < p; ++r) CHECK(run.peak_in_flight[r] == m * v);  // every stage's every micro-batch
        ++shapes;
      }
    }
  }
  CHECK(shapes > 200);
}

TEST_CASE("pipeline plan: 1F1B holds at most p - r micro-batches on rank r, GPipe all m", "[pipeline]") {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      const PipelineShape shape{p, 1, m};
      const auto gpipe = cpprun::detail::simulate(shape, plans_of(ScheduleKind::kGPipe, shape));
      const auto one_f_one_b = cpprun::detail::simulate(shape, plans_of(ScheduleKind::k1F1B, shape));
      for (int r = 0; r < p; ++r) {
        INFO("p=" << p << " m=" << m << " rank " << r);
        CHECK(gpipe.peak_in_flight[r] == m);
        CHECK(one_f_one_b.peak_in_flight[r] == std::min(p - r, m));
      }
    }
  }
}

TEST_CASE("pipeline plan: bubbles are (p-1)/(m+p-1), and (p-1)/(v m + p-1) interleaved", "[pipeline]") {
  // Shapes with m a multiple of p: the interleaved schedule's own.
  // Backward costs twice a forward, as in a transformer; messages are free here.
  for (int p = 1; p <= 6; ++p) {
    for (int m = p; m <= 4 * p; m += p) {
      for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        const PipelineShape shape{p, 1, m};
        const auto run = cpprun::detail::simulate(shape, plans_of(kind, shape));
        INFO(cpprun::detail::to_string(kind) << " p=" << p << " m=" << m);
        CHECK(run.makespan == Approx(3.0 * (m + p - 1)));
        CHECK(run.bubble_fraction() == Approx(double(p - 1) / (m + p - 1)));
      }
      for (int v = 2; v <= 3; ++v) {
        const PipelineShape shape{p, v, m};
        const auto run = cpprun::detail::simulate(shape, plans_of(ScheduleKind::kInterleaved1F1B, shape));
        INFO("interleaved p=" << p << " v=" << v << " m=" << m << " bubble " << run.bubble_fraction());
        CHECK(run.bubble_fraction() == Approx(double(p - 1) / (v * m + p - 1)));
        // Its memory: the warm-up's forwards plus one, in stage-sized (1/v) activations.
        for (int r = 0; r < p; ++r) {
          const int warmup = m == p ? m * v : std::min(m * v, (p - r - 1) * 2 + (v - 1) * p);
          CHECK(run.peak_in_flight[r] == std::min(warmup + 1, m * v));
        }
        // LoopedBFS: the same bubble (its loops meet without a gap when m >= p), for all m * v held.
        const auto looped = cpprun::detail::simulate(shape, plans_of(ScheduleKind::kLoopedBFS, shape));
        INFO("LoopedBFS bubble " << looped.bubble_fraction());
        CHECK(looped.bubble_fraction() == Approx(double(p - 1) / (v * m + p - 1)));
      }
    }
  }
}

TEST_CASE("pipeline plan: zero bubble reaches ZB-H1's ideal, holds at most min(p, m), and idles less than 1F1B",
          "[pipeline]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const PipelineShape shape{p, 1, m};
      INFO("p=" << p << " m=" << m);
      const auto plans = plans_of(ScheduleKind::kZeroBubble, shape);
      // Weight passes are the runtime's (weight_pass_first), so the plan has input passes only.
      for (const auto& plan : plans) {
        int next_input = 0;
        for (const auto& pass : plan) {
          CHECK((pass.kind == PassKind::kForward || pass.kind == PassKind::kBackwardInput));
          if (pass.kind == PassKind::kBackwardInput) CHECK(pass.microbatch == next_input++);
        }
      }
      // A forward, an input pass and a weight pass of one slot each (a whole backward two).
      const auto zb = cpprun::detail::simulate(shape, plans, 1.0, 2.0, 0.5, /*weight_passes_run_as_needed=*/true);
      REQUIRE_FALSE(zb.deadlock);
      if (m >= p) CHECK(zb.makespan == 3.0 * m + p - 1);  // ZB-H1's: p - 1 idle slots, against 1F1B's 3(p - 1)
      for (int r = 0; r < p; ++r) {
        INFO("rank " << r);
        CHECK(zb.peak_in_flight[r] <= std::min(p, m));      // 1F1B's first rank's
        CHECK(zb.peak_in_flight[r] >= std::min(p - r, m));  // 1F1B's own: its weight passes only wait
      }
      // Whatever the weight pass's share of the backward (attention's backward is all input
      // gradient), fewer idle slots than 1F1B.
      for (double weight_share : {0.5, 0.4, 0.3, 0.2}) {
        INFO("weight share " << weight_share);
        const auto split = cpprun::detail::simulate(shape, plans, 1.0, 2.0, weight_share, true);
        const auto whole = cpprun::detail::simulate(shape, plans_of(ScheduleKind::k1F1B, shape), 1.0, 2.0, weight_share);
        REQUIRE_FALSE(split.deadlock);
        if (p > 1) CHECK(split.makespan < whole.makespan);
      }
    }
  }
}

TEST_CASE("pipeline plan: the simulator catches a plan that waits for itself", "[pipeline]") {
  const PipelineShape shape{2, 1, 2};
  auto plans = plans_of(ScheduleKind::k1F1B, shape);
  // Rank 0 waits for micro-batch 0's gradient before sending micro-batch 1's activation, which
  // rank 1 (running GPipe's order) needs before it sends that gradient.
  plans[0] = {{PassKind::kForward, 0, 0}, {PassKind::kBackward, 0, 0}, {PassKind::kForward, 0, 1},
              {PassKind::kBackward, 0, 1}};
  plans[1] = cpprun::detail::plan_rank(ScheduleKind::kGPipe, shape, 1);
  const auto run = cpprun::detail::simulate(shape, plans);
  REQUIRE(run.deadlock);
  CHECK_THAT(*run.deadlock, Catch::Contains("rank 0 waits in B0@s0") && Catch::Contains("rank 1 waits in F1@s1"));
  plans = plans_of(ScheduleKind::k1F1B, shape);
  plans[1] = {{PassKind::kBackward, 1, 0}, {PassKind::kForward, 1, 0}, {PassKind::kForward, 1, 1},
              {PassKind::kBackward, 1, 1}};
  const auto backward_first = cpprun::detail::simulate(shape, plans);
  REQUIRE(backward_first.deadlock);
  CHECK_THAT(*backward_first.deadlock, Catch::Contains("runs B0@s1 before its forward"));
  plans = plans_of(ScheduleKind::k1F1B, shape);
  plans[0] = {{PassKind::kForward, 0, 0}, {PassKind::kForward, 0, 1}, {PassKind::kBackward, 0, 0}};
  const auto short_plan = cpprun::detail::simulate(shape, plans);
  REQUIRE(short_plan.deadlock);
  CHECK_THAT(*short_plan.deadlock, Catch::Contains("does not run each of its passes once"));
  plans = plans_of(ScheduleKind::kZeroBubble, shape);  // input passes, and W0 planned before its own
  plans[0].insert(plans[0].begin() + 1, PipelinePass{PassKind::kBackwardWeight, 0, 0});
  const auto weight_first = cpprun::detail::simulate(shape, plans);
  REQUIRE(weight_first.deadlock);
  CHECK_THAT(*weight_first.deadlock, Catch::Contains("runs W0@s0 before its input pass"));
  plans = plans_of(ScheduleKind::kZeroBubble, shape);
  plans[1].push_back({PassKind::kBackward, 1, 0});  // a whole backward beside the split one
  const auto twice = cpprun::detail::simulate(shape, plans);
  REQUIRE(twice.deadlock);
  CHECK_THAT(*twice.deadlock, Catch::Contains("runs B0@s1 twice"));
}

TEST_CASE("pipeline plan: shapes a schedule cannot run are refused with the fix", "[pipeline]") {
  // PyTorch's rounds: max(1, m / p); 6 on 4 ranks is one round of 6, 10 on 4 two of 5, 9 on 4
  // two rounds that do not divide it.
  CHECK_FALSE(cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, {4, 2, 6}));
  CHECK_FALSE(cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, {4, 2, 10}));
  CHECK_FALSE(cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, {4, 2, 3}));
  auto interleaved = cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, {4, 2, 9});
  REQUIRE(interleaved);
  CHECK_THAT(*interleaved, Catch::Contains("9 micro-batches is not a multiple of 2") && Catch::Contains("use 8 or 10"));
  // The counts it suggests run: 7 on 2 ranks (3 rounds) is refused, and so would be 9 (4 rounds).
  auto seven = cpprun::detail::refuse_shape(ScheduleKind::kInterleaved1F1B, {2, 2, 7});
  REQUIRE(seven);
  CHECK_THAT(*seven, Catch::Contains("use 6 or 8"));
  auto gpipe = cpprun::detail::refuse_shape(ScheduleKind::kGPipe, {2, 2, 4});
  REQUIRE(gpipe);
  CHECK_THAT(*gpipe, Catch::Contains("Interleaved1F1B"));
  CHECK(cpprun::detail::refuse_shape(ScheduleKind::k1F1B, {2, 1, 0}));
}

TEST_CASE("pipeline split: each mistake is named", "[pipeline]") {
  const std::vector<std::string> children{"embed", "block0", "block1", "block2", "head"};
  const auto ranges = cpprun::detail::check_split(children, {{"embed", "block0"}, {"block1", "block2", "head"}}, 2);
  REQUIRE(ranges.size() == 2);
  CHECK((ranges[1].first == 2 && ranges[1].count == 3));
  CHECK_THAT(error_of(children, {{"embed", "block0"}, {"block1", "block2"}}, 2),
             Catch::Contains("\"head\" is in no stage"));
  CHECK_THAT(error_of(children, {{"embed", "block0", "block1"}, {"block1", "block2", "head"}}, 2),
             Catch::Contains("\"block1\" is in stage 0 and in stage 1"));
  CHECK_THAT(error_of(children, {{"embed", "block0", "block0"}, {"block1", "block2", "head"}}, 2),
             Catch::Contains("\"block0\" is in stage 0 twice"));
  CHECK_THAT(error_of(children, {{"embed", "blok0"}, {"block1", "block2", "head"}}, 2),
             Catch::Contains("names \"blok0\", which is not a child") && Catch::Contains("\"block0\""));
  CHECK_THAT(error_of(children, {{"embed", "block1"}, {"block0", "block2", "head"}}, 2),
             Catch::Contains("lists \"block1\" where the model's order has \"block0\""));
  CHECK_THAT(error_of(children, {{"embed", "block0"}, {"block1"}, {"block2", "head"}}, 2),
             Catch::Contains("3 stages, which the pipeline group's 2 ranks do not divide"));
  CHECK_THAT(error_of(children, {{"embed", "block0", "block1", "block2", "head"}, {}}, 2),
             Catch::Contains("stage 1 of the split has no children"));
  CHECK_THAT(error_of(children, {}, 2), Catch::Contains("no stages"));
}

TEST_CASE("pipeline schedules: found by name as PyTorch's get_schedule_class finds them", "[pipeline]") {
  using cpprun::detail::ScheduleKind;
  using cpprun::detail::schedule_kind_named;
  CHECK(schedule_kind_named("gpipe") == ScheduleKind::kGPipe);
  CHECK(schedule_kind_named("GPipe") == ScheduleKind::kGPipe);
  CHECK(schedule_kind_named("ScheduleGPipe") == ScheduleKind::kGPipe);
  CHECK(schedule_kind_named("1f1b") == ScheduleKind::k1F1B);
  CHECK(schedule_kind_named("interleaved-1f1b") == ScheduleKind::kInterleaved1F1B);
  CHECK(schedule_kind_named("Interleaved1F1B") == ScheduleKind::kInterleaved1F1B);
  CHECK(schedule_kind_named("zero-bubble") == ScheduleKind::kZeroBubble);
  CHECK(schedule_kind_named("zero_bubble") == ScheduleKind::kZeroBubble);
  // PyTorch's zero bubble: a torchtitan config's "InterleavedZeroBubble" (one stage a rank: ZB-H1).
  CHECK(schedule_kind_named("InterleavedZeroBubble") == ScheduleKind::kZeroBubble);
  CHECK(schedule_kind_named("ScheduleInterleavedZeroBubble") == ScheduleKind::kZeroBubble);
  CHECK(schedule_kind_named("LoopedBFS") == ScheduleKind::kLoopedBFS);
  CHECK(schedule_kind_named("ScheduleLoopedBFS") == ScheduleKind::kLoopedBFS);
  CHECK(schedule_kind_named("looped-bfs") == ScheduleKind::kLoopedBFS);
  for (const char* name : {"", "schedule", "1f1", "interleaved", "zb", "looped", "gpipe2", "ZBVZeroBubble"}) {
    INFO(name);
    CHECK(!schedule_kind_named(name));
  }
  // PyTorch's schedules that cpprun lacks are told apart from misspellings, by PyTorch's class name.
  using cpprun::detail::pytorch_schedule_not_here;
  CHECK(pytorch_schedule_not_here("zbv-zero-bubble") == "ScheduleZBVZeroBubble");
  CHECK(pytorch_schedule_not_here("ScheduleZBVZeroBubble") == "ScheduleZBVZeroBubble");
  CHECK(pytorch_schedule_not_here("DualPipeV") == "ScheduleDualPipeV");
  CHECK(pytorch_schedule_not_here("PipelineScheduleMulti") == "PipelineScheduleMulti");
  for (const char* name : {"", "schedule", "1f1b", "zb", "InterleavedZeroBubble", "LoopedBFS", "zbv"}) {
    INFO(name);
    CHECK(!pytorch_schedule_not_here(name));
  }
}

TEST_CASE("pipeline names: a stage's checkpoint names under its prefixes, the longest path first", "[pipeline]") {
  using cpprun::detail::renamed;
  const auto prefixes = cpprun::detail::checked_prefixes(
      {{"h3", "blocks.three"}, {"h3.block", "transformer.h.3"}, {"embed", "transformer"}, {"head", "lm_head"},
       {"ln_f", ""}});
  CHECK(renamed(prefixes, "h3.block.attn.c_attn.weight") == "transformer.h.3.attn.c_attn.weight");
  CHECK(renamed(prefixes, "h3.norm.weight") == "blocks.three.norm.weight");  // the shorter path, where only it matches
  CHECK(renamed(prefixes, "embed.wte.weight") == "transformer.wte.weight");
  CHECK(renamed(prefixes, "head.weight") == "lm_head.weight");
  CHECK(renamed(prefixes, "ln_f.bias") == "bias");                           // an empty new prefix: the rest alone
  CHECK(renamed(prefixes, "h30.block.weight") == "h30.block.weight");        // whole components only
  CHECK(renamed(prefixes, "h3") == "h3");                                    // a module path, not a tensor name
  CHECK(renamed(prefixes, "out.weight") == "out.weight");                    // no prefix: the Sequential's name
  CHECK(renamed({}, "h3.block.weight") == "h3.block.weight");
  const auto error_of = [](cpprun::detail::NamePrefixes given) {
    try {
      cpprun::detail::checked_prefixes(std::move(given));
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  CHECK_THAT(error_of({{"h3", "a"}, {"h3", "b"}}), Catch::Contains("\"h3\" is given twice"));
  CHECK_THAT(error_of({{"", "a"}}), Catch::Contains("is not a module path of the stage"));
  CHECK_THAT(error_of({{"h3.", "a"}}), Catch::Contains("\"h3.\" (to \"a\") is not a module path"));
  CHECK_THAT(error_of({{"h3..block", "a"}}), Catch::Contains("is not a module path"));
  CHECK_THAT(error_of({{"h3", "transformer..h"}}), Catch::Contains("the new prefix must be a module path"));
  CHECK(error_of({{"h3", "transformer.h.3"}, {"h4", ""}}).empty());
}

TEST_CASE("pipeline split: even ranges give the first stages the extra children", "[pipeline]") {
  const auto ranges = cpprun::detail::even_ranges(7, 3);
  REQUIRE(ranges.size() == 3);
  CHECK((ranges[0].count == 3 && ranges[1].count == 2 && ranges[2].count == 2));
  CHECK((ranges[1].first == 3 && ranges[2].first == 5));
  CHECK_THROWS_WITH(cpprun::detail::even_ranges(2, 3), Catch::Contains("cannot cut 2 children into 3 stages"));
}

TEST_CASE("pipeline ties: a tensor two stages hold is one tie, found alike from any order of names", "[pipeline]") {
  int embedding = 0, block = 0, head_bias = 0, shared_norm = 0;  // identities
  using cpprun::detail::StageParameter;
  const auto found = cpprun::detail::find_ties({{{&embedding, "embed.weight"}, {&shared_norm, "norm0.weight"}},
                                                {{&block, "h0.weight"}, {&shared_norm, "norm1.weight"}},
                                                {{&head_bias, "head.bias"}, {&embedding, "head.weight"}}});
  REQUIRE(found.ties.size() == 2);
  CHECK(found.ties[0].stages == std::vector<int>{0, 2});
  CHECK(found.ties[0].description == "stage 0's embed.weight, stage 2's head.weight");
  CHECK(found.ties[1].stages == std::vector<int>{0, 1});
  CHECK(found.tie_of[0] == std::vector<int>{0, 1});
  CHECK(found.tie_of[1] == std::vector<int>{-1, 1});
  CHECK(found.tie_of[2] == std::vector<int>{-1, 0});
  // Within one stage a shared tensor is no tie: autograd sums it there.
  const auto within = cpprun::detail::find_ties({{{&embedding, "a"}, {&embedding, "b"}}, {{&block, "c"}}});
  CHECK(within.ties.empty());
}

TEST_CASE("pipeline messages: each has its own tag, and a label saying which stage sends what to whom", "[pipeline]") {
  using cpprun::detail::StageMessage;
  using cpprun::detail::stage_message_label;
  using cpprun::detail::stage_message_tag;
  const int stages = 4, microbatches = 6;
  std::vector<int> tags;
  for (StageMessage kind : {StageMessage::kShape, StageMessage::kActivation, StageMessage::kGradient}) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int mb = 0; mb < (kind == StageMessage::kShape ? 1 : microbatches); ++mb) {
        tags.push_back(stage_message_tag(kind, stage, mb, microbatches, stages));
      }
    }
  }
  std::sort(tags.begin(), tags.end());
  CHECK(std::adjacent_find(tags.begin(), tags.end()) == tags.end());
  CHECK(tags.front() >= (1 << 26));
  CHECK(tags.back() < (1 << 27));
  CHECK(stage_message_label(StageMessage::kActivation, false, 2, 1, 3) ==
        "pipeline stage 2: the activation of micro-batch 3 from stage 1");
  CHECK(stage_message_label(StageMessage::kGradient, true, 2, 1, 0) ==
        "pipeline stage 2: the gradient of micro-batch 0 to stage 1");
  CHECK(stage_message_label(StageMessage::kShape, true, 0, 1, 0) ==
        "pipeline stage 0: the shape of this step's activations to stage 1");
  CHECK_THROWS_WITH(stage_message_tag(StageMessage::kActivation, 0, 0, 1 << 20, 64),
                    Catch::Matchers::Contains("use fewer micro-batches"));
}
