# A pipeline stage that stops sending (tests/dist/pipeline_hang_probe.cpp, 2 ranks, a 3 s group
# timeout): the waiting rank fails at the timeout with a message naming its stage and the likely
# cause; the job ends within seconds of that wait's start (not the 60 s the other rank lingers),
# the launcher's diagnosis says where each rank stopped, and nothing is left running.
# usage: pipeline_hang.sh CPPRUN PROBE
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: pipeline_hang.sh CPPRUN PROBE}

cpprun --standalone --nproc_per_node=2 "$PROBE" "$WORK"
status=$?
ended=$(now_ms)
[ "$status" != 0 ] || fail "the job exited 0"
expect_in_file "$WORK/err" "pipeline rank 1 (stage 1) waiting at the start of step() for every pipeline rank to begin the step" \
  "rank 1's error"
expect_in_file "$WORK/err" "rank 1 (local_rank 1" "the launcher's root cause"
# The launcher's diagnosis: rank 0 stopped after the first step's loss broadcast; rank 1 failed in
# the second step's opening all-reduce (the messages, all delivered, are not mistaken for a hang).
expect_in_file "$WORK/err" "rank 0 finished broadcast #2 (float64[2], root 1) and called no collective" "the diagnosis of rank 0"
expect_in_file "$WORK/err" "rank 1 failed in all_reduce #3 (int64[2], max)" "the diagnosis of rank 1"
ended_between "rank 1 began waiting (3 s timeout)" "$ended" 3000 15000 "$WORK/waiting.1"
expect_no_leftovers_within 5
echo "PASS: the job ended $ELAPSED ms after rank 1 began waiting: $(grep -m1 -o "pipeline rank 1 (stage 1) waiting[^:]*" "$WORK/err")"
