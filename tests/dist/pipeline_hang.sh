# A pipeline stage that stops (tests/dist/pipeline_hang_probe.cpp, 2 ranks, a 3 s group timeout),
# twice: rank 0 leaves its loop a step early (the others wait at the step's opening agreement), then
# stage 0's forward stalls inside a step (stage 1 waits for its message). Each time the waiting rank
# fails at the timeout with a message naming its stage and the likely cause; the job ends within
# seconds of that wait's start (not the 60 s the other rank lingers), the launcher's diagnosis says
# where each rank stopped, naming the pipeline stage and the message it waits for, and nothing is
# left running.
# usage: pipeline_hang.sh CPPRUN PROBE
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: pipeline_hang.sh CPPRUN PROBE}

cpprun --standalone --nproc_per_node=2 "$PROBE" "$WORK" leave
status=$?
ended=$(now_ms)
[ "$status" != 0 ] || fail "leave: the job exited 0"
expect_in_file "$WORK/err" "pipeline rank 1 (stage 1) waiting at the start of step() for every pipeline rank to begin the step" \
  "rank 1's error"
expect_in_file "$WORK/err" "rank 1 (local_rank 1" "the launcher's root cause"
# The launcher's diagnosis: rank 0 stopped after the first step's loss broadcast; rank 1 failed in
# the second step's opening all-reduce (the messages, all delivered, are not mistaken for a hang).
# Collectives #0-2 are the schedule's construction (Note [One schedule on every pipeline rank]).
expect_in_file "$WORK/err" "rank 0 finished broadcast #5 (float64[2], root 1) in PipelineSchedule::step and called no collective" "the diagnosis of rank 0"
# Its 4 values: the inputs' and targets' rows and each of the 2 ranks' call (Note [A step's opening
# exchange] in pipeline/schedule_runtime.cpp; no tie here).
expect_in_file "$WORK/err" "rank 1 failed in all_reduce #6 (int64[4], max)" "the diagnosis of rank 1"
ended_between "rank 1 began waiting (3 s timeout)" "$ended" 3000 15000 "$WORK/waiting.1"
expect_no_leftovers_within 5
echo "PASS: leave: the job ended $ELAPSED ms after rank 1 began waiting: $(grep -m1 -o "pipeline rank 1 (stage 1) waiting[^:]*" "$WORK/err")"

rm -f "$WORK/waiting.1"
cpprun --standalone --nproc_per_node=2 "$PROBE" "$WORK" stall
status=$?
ended=$(now_ms)
[ "$status" != 0 ] || fail "stall: the job exited 0"
expect_in_file "$WORK/err" "pipeline stage 1 (rank 1) waiting for the shape of stage 0's output (from rank 0, which has not sent it" \
  "stall: rank 1's error"
# Both ranks passed the second step's opening all-reduce (no collective is pending, so the
# diagnosis has no line for them); rank 1's receive of stage 0's first message failed, and the
# diagnosis says which stage waited for what (the flight recorder's label).
expect_in_file "$WORK/err" "(pipeline stage 1: the shape of this step's activations from stage 0)" \
  "stall: the diagnosis of rank 1's message"
grep -E "point-to-point: .*rank 1 failed in recv #[0-9]+ \(int64\[18\]\) from rank 0 \(pipeline stage 1" "$WORK/err" >/dev/null ||
  fail "stall: the diagnosis does not say that rank 1 failed in its receive from rank 0: $(grep point-to-point "$WORK/err")"
ended_between "rank 1 began waiting (3 s timeout)" "$ended" 3000 15000 "$WORK/waiting.1"
expect_no_leftovers_within 5
echo "PASS: stall: the job ended $ELAPSED ms after rank 1 began waiting: $(grep -m1 -o "group [^ ]* point-to-point: .*" "$WORK/err")"
