# The faults of issue 27, made as a careless user makes them: the default timeout (30 minutes),
# nothing caught, under the default mode and under TORCH_DISTRIBUTED_DEBUG=DETAIL. Each job must
# end within 10 s of the fault with a non-zero exit, the failing ranks' own message naming the
# collective, cpprun's diagnosis naming the rank and where it was, and nothing left running.
# usage: fault_cases.sh CPPRUN PROBE MODE   (MODE: default | detail; PROBE: consistency_probe)
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: fault_cases.sh CPPRUN PROBE MODE}
MODE=${3:?usage: fault_cases.sh CPPRUN PROBE MODE}
case $MODE in
default) debug=OFF ;;
detail) debug=DETAIL ;;
*) echo "fault_cases.sh: MODE must be default or detail, got '$MODE'" >&2; exit 2 ;;
esac

# Runs the probe's CASE on NPROC ranks; fails the test unless the job fails within 10 s of the
# fault and leaves nothing behind. The fault is reached when the last rank makes its mismatched
# call (each marks fault.RANK just before): the 10 s leave out the job's start-up.
run_fault() {  # CASE NPROC
  local ended elapsed status rank marks=()
  rm -f "$WORK"/fault.*
  env TORCH_DISTRIBUTED_DEBUG=$debug CPPRUN_PROBE_UNCAUGHT=1 CPPRUN_TEST_TAG="$WORK" \
    timeout -k 5 60 "$CPPRUN" --standalone --nproc_per_node="$2" "$PROBE" "$1" "$WORK" >"$WORK/out" 2>"$WORK/err"
  status=$?
  ended=$(now_ms)
  [ "$status" != 124 ] && [ "$status" != 137 ] || fail "$1 ($MODE): the job was still running after 60 s"
  [ "$status" != 0 ] || fail "$1 ($MODE): the job exited 0"
  for ((rank = 0; rank < $2; rank++)); do marks+=("$WORK/fault.$rank"); done
  latest_mark "$1 ($MODE): a rank did not reach the fault" "${marks[@]}"
  elapsed=$((ended - MARK))
  [ "$elapsed" -le 10000 ] || fail "$1 ($MODE): the job took $elapsed ms to end after the fault (at most 10 s)"
  expect_no_leftovers_within 5
  echo "$1 ($MODE, $2 ranks): ended $elapsed ms after the fault, with exit $status"
}

expect_err() {  # text case
  expect_in_file "$WORK/err" "$1" "$2 ($MODE)"
  # What reaches the user is ours, never Gloo's own exception type raw.
  if grep -q "instance of 'gloo::" "$WORK/err"; then fail "$2 ($MODE): a raw Gloo exception reached the program"; fi
}

# Sum on rank 0, max on rank 1: both ranks fail before the data moves (no wrong result).
run_fault all_reduce_op 2
expect_err "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float32[4], max)." all_reduce_op
expect_err "cpprun: diagnosis (" all_reduce_op

# all_reduce against broadcast: at once, not at the timeout.
run_fault op 2
expect_err "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called broadcast(float32[4], root 0)." op

# Sizes and dtypes that differ: our message, not Gloo's abort.
run_fault all_reduce_size 2
expect_err "rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float32[8], sum)." all_reduce_size
run_fault dtype 2
expect_err "rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float64[4], sum)." dtype

# The ring collectives at 3 ranks: rank 0's all-gather of another size. Its neighbours find it;
# rank 2, whose neighbour agrees, is stopped by cpprun within seconds.
run_fault all_gather_size 3
expect_err "rank 0 called all_gather_into(float32[12], float32[4])" all_gather_size
expect_err "cpprun: diagnosis (" all_gather_size

# A rank that skips a collective and exits 0: the others are told at once, and the diagnosis
# says which rank made one collective fewer.
run_fault skip_and_exit 2
expect_err "rank 0 finished all_reduce #2 (float32[3], sum) and called no collective" skip_and_exit
expect_err "rank 1 failed in all_reduce #3 (float32[4], sum)" skip_and_exit
expect_err "on rank 1: a rank's process ended before reaching it" skip_and_exit

# Skipped, then identical calls: no check can tell the pairs apart (the calls agree in every
# field), so the job fails at the last one, and the diagnosis names the rank with one fewer.
run_fault skip_then_identical 2
expect_err "rank 0 finished all_reduce #4 (float32[4], sum) and called no collective" skip_then_identical
expect_err "rank 1 failed in all_reduce #5 (float32[4], sum)" skip_then_identical
expect_err "on rank 1: a rank's process ended before reaching it" skip_then_identical
echo PASS
