# Workers stuck in the kernel (uninterruptible sleep, Linux D state).
# 1-3: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, on a worker that vfork()s and whose child sleeps
#      before _exit ($2: cpprun_vfork_sleeper), as torchrun 2.15's agent measures and acts on it,
#      but exiting 1 where torchrun exits 0 (Note [An unhealthy attempt] in workers/attempt.h).
# 4-5: the wait after SIGKILL is bounded (Note [A worker SIGKILL cannot end] in workers/attempt.cpp),
#      on a worker frozen in a cgroup-v1 freezer: D state, and SIGKILL cannot end it until thawed.
#      Needs root and /sys/fs/cgroup/freezer; said (and skipped) otherwise, as vfork's D ends on SIGKILL.
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

# 1. Rank 1 stays in D: the attempt ends as unhealthy after 1 s in D, with restarts left unused.
rm -f "$WORK/in_d_ms"
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=1 cpprun --nproc_per_node=2 --max_restarts=2 --monitor_interval=0.1 /bin/sh -c '
  if [ "$LOCAL_RANK" = 1 ]; then date +%s%3N >"$WORK/in_d_ms"; exec "$VFORK" 60; fi
  exec sleep 60'
rc=$?
ended=$(now_ms)
expect_eq "$rc" 1 "exit code with a worker stuck in D"
latest_mark "rank 1 in D" "$WORK/in_d_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -ge 1000 ] || fail "ended ${elapsed} ms after rank 1 went into D: before the 1 s timeout"
[ "$elapsed" -lt 10000 ] || fail "ended ${elapsed} ms after rank 1 went into D: the timeout was not acted on"
expect_in_file "$WORK/err" "cpprun: warning: rank 1 (local_rank 1, pid" "the warning when rank 1 entered D"
expect_in_file "$WORK/err" "entered uninterruptible sleep (D state)" "the warning"
expect_in_file "$WORK/err" "stuck in uninterruptible sleep (D state) for 1." "the error"
expect_in_file "$WORK/err" "(>= 1.0 s, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT); stopped every worker, no restart" \
  "the summary"
expect_in_file "$WORK/err" "exiting with code 1 (no restart, as torchrun's agent)" "the exit line"
grep -q "rank 0 (local_rank 0, pid [0-9]*) entered" "$WORK/err" && fail "rank 0 (in sleep, state S) was said to be in D"
grep -q "restarting" "$WORK/err" && fail "restarted after a worker stuck in D"
expect_no_leftovers

# 2. A dwell in D shorter than the timeout is warned of, not acted on: the job succeeds.
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=4 cpprun --nproc_per_node=1 "$VFORK" 1
rc=$?
expect_eq "$rc" 0 "exit code with 1 s in D under a 4 s timeout"
expect_in_file "$WORK/err" "entered uninterruptible sleep (D state)" "the warning of a short dwell"
grep -q "stuck in" "$WORK/err" && fail "a 1 s dwell was taken for a stuck worker under a 4 s timeout"

# 3. Not a positive number: the check is off, as torchrun's (no error either).
for value in soon 0 -3; do
  TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value cpprun --nproc_per_node=1 "$VFORK" 1.5
  rc=$?
  expect_eq "$rc" 0 "exit code with TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value"
  grep -q "uninterruptible" "$WORK/err" && fail "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=$value did not leave the check off"
done
expect_no_leftovers

# torchrun itself on part 1's job (with a python that has torch): the same warning, error and no
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
torchrun_said=", torchrun compared"

FREEZER=/sys/fs/cgroup/freezer
CG=$FREEZER/cpprun-test-$$
if [ "$(id -u)" != 0 ] || [ ! -d "$FREEZER" ] || ! mkdir "$CG" 2>/dev/null; then
  # Counted as a skip (77), not passed: a test missing a part is not reported as passed.
  echo "SKIP: parts 4-5 need root and a cgroup-v1 freezer to create a group in (no worker that SIGKILL cannot" \
       "end without one); parts 1-3${torchrun_said} passed"
  exit 77
fi
thaw() {
  echo THAWED >"$CG/freezer.state" 2>/dev/null
}
# Thawed before common.sh's cleanup kills the tagged processes (a frozen one would not die).
trap 'thaw; cleanup; for _ in $(seq 1 50); do rmdir "$CG" 2>/dev/null && break; sleep 0.1; done' EXIT
# Freezes process $1 in the test's freezer group; it shows D, and SIGKILL waits for the thaw.
freeze() {
  echo "$1" >"$CG/cgroup.procs" || fail "cannot move pid $1 into $CG"
  echo FROZEN >"$CG/freezer.state"
  for _ in $(seq 1 100); do
    [ "$(cat "$CG/freezer.state")" = FROZEN ] && return
    sleep 0.05
  done
  fail "$CG did not freeze"
}

# 4. Rank 0 frozen, rank 1 fails: SIGTERM, 1 s, SIGKILL, 1 s more, then cpprun gives up on rank 0,
#    restarts (a restart is left: as torchrun, abandoning is no reason not to), and reaps rank 0
#    when it ends during the second attempt: no zombie of its own left behind.
rm -f "$WORK/rank0.pid" "$WORK/frozen" "$WORK/failed_ms" "$WORK/finish" "$WORK/rc"
(
  cpprun --nproc_per_node=2 --shutdown_timeout=1 --max_restarts=1 --restart_backoff=0 /bin/sh -c '
    if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then
      i=0; while [ ! -e "$WORK/finish" ]; do i=$((i+1)); [ $i -gt 600 ] && exit 98; sleep 0.05; done
      exit 0
    fi
    if [ "$LOCAL_RANK" = 1 ]; then
      i=0; while [ ! -e "$WORK/frozen" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 99; sleep 0.05; done
      date +%s%3N >"$WORK/failed_ms"
      exit 3
    fi
    echo $$ >"$WORK/rank0.tmp" && mv "$WORK/rank0.tmp" "$WORK/rank0.pid"
    exec sleep 60'
  echo $? >"$WORK/rc"
) &
job=$!
wait_for_files 30 "$WORK/rank0.pid"
stuck=$(cat "$WORK/rank0.pid")
freeze "$stuck"
touch "$WORK/frozen"
wait_for_text 20 "$WORK/err" "restarting all workers"
latest_mark "rank 1's failure" "$WORK/failed_ms"
elapsed=$(($(now_ms) - MARK))
[ "$elapsed" -ge 2000 ] || fail "restarted ${elapsed} ms after the failure: before SIGTERM's and SIGKILL's 1 s each"
[ "$elapsed" -lt 8000 ] || fail "restarted ${elapsed} ms after the failure: the wait after SIGKILL was not bounded"
expect_in_file "$WORK/err" "cpprun: error: rank 0 (local_rank 0, pid $stuck) did not exit within 1s of SIGKILL; abandoning it" \
  "the line giving up on the frozen rank 0"
expect_in_file "$WORK/err" "rank 0 (local_rank 0, pid $stuck) not stopped: did not exit within --shutdown_timeout=1s of SIGTERM nor after SIGKILL; left behind" \
  "the summary"
expect_eq "$(state_of "$stuck")" D "state of the abandoned rank 0 before the thaw"
thaw
for _ in $(seq 1 100); do
  [ -e "/proc/$stuck" ] || break
  sleep 0.05
done
[ -e "/proc/$stuck" ] && fail "the abandoned rank 0 (pid $stuck) was not reaped once it ended (state $(state_of "$stuck"))"
[ -e "$WORK/rc" ] && fail "cpprun ended before the second attempt was told to finish"
touch "$WORK/finish"
wait "$job"
expect_eq "$(cat "$WORK/rc")" 0 "exit code after the restart succeeded"
expect_no_leftovers

# 5. No restart left: cpprun exits (rank 1's code) with rank 0 still frozen, instead of waiting for it.
rm -f "$WORK/rank0.pid" "$WORK/frozen" "$WORK/failed_ms" "$WORK/rc"
(
  cpprun --nproc_per_node=2 --shutdown_timeout=1 /bin/sh -c '
    if [ "$LOCAL_RANK" = 1 ]; then
      i=0; while [ ! -e "$WORK/frozen" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 99; sleep 0.05; done
      date +%s%3N >"$WORK/failed_ms"
      exit 3
    fi
    echo $$ >"$WORK/rank0.tmp" && mv "$WORK/rank0.tmp" "$WORK/rank0.pid"
    exec sleep 60'
  echo $? >"$WORK/rc"
) &
job=$!
wait_for_files 30 "$WORK/rank0.pid"
stuck=$(cat "$WORK/rank0.pid")
freeze "$stuck"
touch "$WORK/frozen"
wait_for_files 20 "$WORK/rc"
latest_mark "rank 1's failure" "$WORK/failed_ms"
elapsed=$(($(now_ms) - MARK))
[ "$elapsed" -lt 8000 ] || fail "cpprun exited ${elapsed} ms after the failure: the wait after SIGKILL was not bounded"
wait "$job"
expect_eq "$(cat "$WORK/rc")" 3 "exit code (rank 1's) with rank 0 abandoned"
expect_in_file "$WORK/err" "pid $stuck) did not exit within 1s of SIGKILL; abandoning it" "the line giving up on rank 0"
expect_eq "$(state_of "$stuck")" D "state of rank 0 after cpprun exited"
thaw
# Now init's (or an outer subreaper's) child: it ends at once; whether it is reaped is up to them.
for _ in $(seq 1 100); do
  s=$(state_of "$stuck")
  [ -z "$s" ] || [ "$s" = Z ] && break
  sleep 0.05
done
s=$(state_of "$stuck")
[ -z "$s" ] || [ "$s" = Z ] || fail "rank 0 (pid $stuck) did not end once thawed (state $s)"
expect_no_leftovers
echo "PASS (1-5${torchrun_said})"
