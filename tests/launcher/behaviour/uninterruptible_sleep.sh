# Workers stuck in the kernel (uninterruptible sleep, Linux D state): TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT,
# on a worker that vfork()s and whose child sleeps before _exit ($2: cpprun_vfork_sleeper), as torchrun
# 2.15's agent measures and acts on it, but exiting 1 where torchrun exits 0 (Note [An unhealthy
# attempt] in workers/attempt.h). Parts 0-3 are cpprun's; torchrun's own run comes last, a counted skip
# (77) without a python that has torch. The wait after SIGKILL is sigkill_wait.sh's.
. "$(dirname "$0")/common.sh"
VFORK=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_vfork_sleeper}
export VFORK

state_of() { awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null; }

# 0. The premise: a process waiting in vfork() for its sleeping child shows D in /proc here.
"$VFORK" 2 &
helper=$!
seen=
for _ in $(seq 1 40); do
  seen=$(state_of "$helper")
  [ "$seen" = D ] && break
  sleep 0.05
done
wait "$helper"
expect_eq "$seen" D "/proc state of a process blocked in vfork()"

# 1. Rank 1 stays in D: the attempt ends as unhealthy after 1 s in D, with restarts left unused; the
#    error says where it waits and what to do, and the launcher's error file records it.
rm -f "$WORK/in_d_ms"
TORCHELASTIC_ERROR_FILE=$WORK/launcher_error.json TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=1 cpprun --nproc_per_node=2 --max_restarts=2 --monitor_interval=0.1 /bin/sh -c '
  if [ "$LOCAL_RANK" = 1 ]; then date +%s%3N >"$WORK/in_d_ms"; exec "$VFORK" 60; fi
  exec sleep 60'
rc=$?
ended=$(now_ms)
expect_eq "$rc" 1 "exit code with a worker stuck in D"
latest_mark "rank 1 in D" "$WORK/in_d_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -ge 1000 ] || fail "ended ${elapsed} ms after rank 1 went into D: before the 1 s timeout"
# No upper bound on the time (the machine may be slow): a timeout never acted on leaves both ranks
# running 60 s to exit 0, which the exit code and the lines below refuse (and ctest's TIMEOUT bounds).
expect_in_file "$WORK/err" "cpprun: warning: rank 1 (local_rank 1, pid" "the warning when rank 1 entered D"
expect_in_file "$WORK/err" "entered uninterruptible sleep (D state)" "the warning"
expect_in_file "$WORK/err" "stuck in uninterruptible sleep (D state) for 1." "the error"
expect_in_file "$WORK/err" "(>= 1.0 s, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT); stopped every worker, no restart" \
  "the summary"
expect_in_file "$WORK/err" "exiting with code 1 (no restart, as torchrun's agent)" "the exit line"
expect_in_file "$WORK/err" "/wchan" "where the stuck worker waits (/proc/PID/wchan)"
expect_in_file "$WORK/err" "If this was slow I/O (e.g. a checkpoint write on NFS), raise or unset TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT; otherwise check the driver or mount" \
  "what to do about a stuck worker"
expect_in_file "$WORK/launcher_error.json" "stuck in uninterruptible sleep (D state) for 1." \
  "the launcher's TORCHELASTIC_ERROR_FILE"
grep -q "rank 0 (local_rank 0, pid [0-9]*) entered" "$WORK/err" && fail "rank 0 (in sleep, state S) was said to be in D"
grep -q "restarting" "$WORK/err" && fail "restarted after a worker stuck in D"
expect_no_leftovers

# 2. Dwells in D shorter than the timeout are warned of, once per worker, not acted on: the job succeeds.
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=4 cpprun --nproc_per_node=1 "$VFORK" 1 0 3
rc=$?
expect_eq "$rc" 0 "exit code with three 1 s dwells in D under a 4 s timeout"
expect_in_file "$WORK/err" "entered uninterruptible sleep (D state)" "the warning of a short dwell"
expect_eq "$(grep -c "entered uninterruptible sleep" "$WORK/err")" 1 "warnings for one worker's three dwells in D"
grep -q "stuck in" "$WORK/err" && fail "a 1 s dwell was taken for a stuck worker under a 4 s timeout"

# 3. Not a positive number: the check is off, as torchrun's (no error either), and one note says so.
for value in soon 0 -3; do
  TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value cpprun --nproc_per_node=1 "$VFORK" 1.5
  rc=$?
  expect_eq "$rc" 0 "exit code with TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value"
  grep -q "uninterruptible" "$WORK/err" && fail "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value did not leave the check off"
  expect_eq "$(grep -c "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT='$value' is not a number of seconds above 0: the D-state check is off" "$WORK/err")" \
    1 "the note for TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value"
done
expect_no_leftovers

# 4. torchrun itself on part 1's job (with a python that has torch): the same warning, error and no
# restart, and its exit code 0, which cpprun does not copy (Note [An unhealthy attempt]).
find_torch_python_or_skip  # sets $python, or ends the test as a counted skip
mkdir -p "$WORK/torchrun_tmp"  # torchrun keeps its torchelastic_* dir
TMPDIR=$WORK/torchrun_tmp TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=1 CPPRUN_TEST_TAG=$WORK timeout 60 "$python" -m torch.distributed.run \
  --nproc_per_node=2 --max_restarts=2 --no_python /bin/sh -c '
  if [ "$LOCAL_RANK" = 1 ]; then exec "$VFORK" 60; fi
  exec sleep 60' >"$WORK/torchrun.log" 2>&1
rc=$?
expect_eq "$rc" 0 "torchrun's exit code with a worker stuck in D (if this changed, revisit Note [An unhealthy attempt])"
expect_in_file "$WORK/torchrun.log" "entered uninterruptible sleep (D-state)" "torchrun's warning"
expect_in_file "$WORK/torchrun.log" "stuck in uninterruptible sleep (D-state) for 1." "torchrun's error"
expect_in_file "$WORK/torchrun.log" "marking worker group UNHEALTHY and disabling restarts" "torchrun's error"
grep -q "will restart worker group" "$WORK/torchrun.log" && fail "torchrun restarted after a worker stuck in D"
expect_no_leftovers
echo "PASS (0-3, torchrun compared)"

