# The wait after SIGKILL is bounded (Note [A worker SIGKILL cannot end] in workers/attempt.cpp) and no
# shorter than torchrun's 30 s (Note [The wait after SIGKILL] in workers/kill_wait.h), on processes
# frozen in a cgroup-v1 freezer: D state, and SIGKILL cannot end them until thawed. Needs root and
# /sys/fs/cgroup/freezer: a counted skip (77) otherwise, as we know no unprivileged way to make a
# process that SIGKILL cannot end.
. "$(dirname "$0")/common.sh"

state_of() { awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null; }

FREEZER=/sys/fs/cgroup/freezer
CG=$FREEZER/cpprun-test-$$
if [ "$(id -u)" != 0 ] || [ ! -d "$FREEZER" ] || ! mkdir "$CG" 2>/dev/null; then
  # Counted as a skip (77), not passed: a test missing a part is not reported as passed.
  echo "SKIP: needs root and a cgroup-v1 freezer to create a group in (no worker that SIGKILL cannot end" \
       "without one; vfork()'s D ends on SIGKILL)"
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
# Waits (up to $2 s, a guard) until frozen process $1 has SIGKILL pending: cpprun's wait after SIGKILL
# has begun. $1 must ignore SIGTERM: the kernel marks SIGKILL pending for a fatal SIGTERM too.
wait_for_sigkill_pending() {
  local deadline=$((SECONDS + $2)) pending
  while :; do
    pending=$(awk '/^SigPnd:/ { print $2 }' "/proc/$1/status" 2>/dev/null)
    [ -n "$pending" ] && (( (16#$pending >> 8) & 1 )) && return  # bit 8: signal 9
    [ "$SECONDS" -lt "$deadline" ] || fail "pid $1 never got SIGKILL (pending: '$pending')"
    sleep 0.05
  done
}
# `cpprun --diagnose` of cpprun $1 (during a wait after SIGKILL): answered, not dropped to its own 30 s timeout.
ask_diagnosis() {
  "$CPPRUN" --diagnose "$1" >"$WORK/asked.out" 2>"$WORK/asked.err"
  expect_eq $? 0 "cpprun --diagnose's exit code in the wait after SIGKILL ($(cat "$WORK/asked.err"))"
}

# 1. Rank 0 frozen, rank 1 fails: SIGTERM, 1 s, SIGKILL, 30 s more, then cpprun gives up on rank 0,
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
wait_for_text 50 "$WORK/err" "restarting all workers"
latest_mark "rank 1's failure" "$WORK/failed_ms"
elapsed=$(($(now_ms) - MARK))
[ "$elapsed" -ge 31000 ] || fail "restarted ${elapsed} ms after the failure: before SIGTERM's 1 s and SIGKILL's 30 s"
# No upper bound on the time: a wait never bounded never restarts (rank 0 stays frozen until thawed
# below), which wait_for_text above refuses.
expect_in_file "$WORK/err" "cpprun: error: rank 0 (local_rank 0, pid $stuck) did not exit within 30s of SIGKILL; abandoning it" \
  "the line giving up on the frozen rank 0"
expect_in_file "$WORK/err" "rank 0 (local_rank 0, pid $stuck) not stopped: did not exit within --shutdown_timeout=1s of SIGTERM nor within 30s of SIGKILL; left behind" \
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

# 2. No restart left: cpprun exits (rank 1's code) with rank 0 still frozen, instead of waiting for it.
#    A `cpprun --diagnose` during the wait is answered at once, naming rank 0 as SIGKILLed.
rm -f "$WORK/rank0.pid" "$WORK/frozen" "$WORK/failed_ms" "$WORK/rc" "$WORK/launcher.pid"
(
  cpprun --nproc_per_node=2 --shutdown_timeout=1 /bin/sh -c '
    if [ "$LOCAL_RANK" = 1 ]; then
      i=0; while [ ! -e "$WORK/frozen" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 99; sleep 0.05; done
      date +%s%3N >"$WORK/failed_ms"
      exit 3
    fi
    echo $PPID >"$WORK/launcher.tmp" && mv "$WORK/launcher.tmp" "$WORK/launcher.pid"
    echo $$ >"$WORK/rank0.tmp" && mv "$WORK/rank0.tmp" "$WORK/rank0.pid"
    trap "" TERM  # see wait_for_sigkill_pending
    exec sleep 60'
  echo $? >"$WORK/rc"
) &
job=$!
wait_for_files 30 "$WORK/rank0.pid" "$WORK/launcher.pid"
stuck=$(cat "$WORK/rank0.pid")
freeze "$stuck"
touch "$WORK/frozen"
wait_for_sigkill_pending "$stuck" 50
ask_diagnosis "$(cat "$WORK/launcher.pid")"
expect_in_file "$WORK/asked.out" "the attempt is ending: cpprun waits for its SIGKILLed workers to exit" "the answer's reason"
expect_in_file "$WORK/asked.out" "rank 0 (SIGKILLed, not exited yet (uninterruptible sleep, D state?); given up on 30s after the SIGKILL)" \
  "the answer naming the frozen rank 0"
expect_in_file "$WORK/asked.out" "rank 1 (exited with code 3)" "the answer naming rank 1's failure"
# No upper bound on the time: a wait never bounded never ends (rank 0 stays frozen), which the guard refuses.
wait_for_files 50 "$WORK/rc"
wait "$job"
expect_eq "$(cat "$WORK/rc")" 3 "exit code (rank 1's) with rank 0 abandoned"
expect_in_file "$WORK/err" "pid $stuck) did not exit within 30s of SIGKILL; abandoning it" "the line giving up on rank 0"
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

# 3. A leftover (a setsid()ed process the worker left, adopted by cpprun) frozen, its child not: cpprun
#    gives up on the leftover 30 s after SIGKILL and SIGKILLs its child, which would otherwise outlive
#    the job (it is the frozen process's child, not cpprun's, until that one ends). A `cpprun
#    --diagnose` during the wait is answered at once: no worker runs.
rm -f "$WORK/x.pid" "$WORK/c.pid" "$WORK/go" "$WORK/rc" "$WORK/launcher.pid"
(
  cpprun --nproc_per_node=1 --shutdown_timeout=1 /bin/sh -c '
    setsid /bin/sh -c "sleep 1000 & echo \$! >\"$WORK/c.tmp\"; mv \"$WORK/c.tmp\" \"$WORK/c.pid\";
                       echo \$\$ >\"$WORK/x.tmp\"; mv \"$WORK/x.tmp\" \"$WORK/x.pid\"; trap \"\" TERM; exec sleep 999" &
    echo $PPID >"$WORK/launcher.tmp" && mv "$WORK/launcher.tmp" "$WORK/launcher.pid"
    i=0; while [ ! -e "$WORK/go" ]; do i=$((i+1)); [ $i -gt 600 ] && exit 99; sleep 0.05; done
    exit 0'
  echo $? >"$WORK/rc"
) &
job=$!
wait_for_files 30 "$WORK/x.pid" "$WORK/c.pid" "$WORK/launcher.pid"
leftover=$(cat "$WORK/x.pid")
child=$(cat "$WORK/c.pid")
freeze "$leftover"
touch "$WORK/go"
wait_for_sigkill_pending "$leftover" 50
ask_diagnosis "$(cat "$WORK/launcher.pid")"
expect_in_file "$WORK/asked.out" "cpprun: no diagnosis (asked by cpprun --diagnose from pid" "the answer"
expect_in_file "$WORK/asked.out" "no worker runs; cpprun is stopping 1 process the workers left behind: $leftover (sleep)" \
  "the answer naming the frozen leftover"
wait_for_files 50 "$WORK/rc"
wait "$job"
expect_eq "$(cat "$WORK/rc")" 0 "exit code (the worker's) with its leftover abandoned"
expect_in_file "$WORK/err" "$leftover (sleep) did not end within 30s of SIGKILL; giving up on it" "the line giving up on the leftover"
expect_in_file "$WORK/err" "SIGKILLed the 1 process it started" "the leftover's child, named as killed"
expect_eq "$(state_of "$leftover")" D "state of the abandoned leftover after cpprun exited"
s=$(state_of "$child")
[ -z "$s" ] || [ "$s" = Z ] || fail "the frozen leftover's child (pid $child) outlived cpprun (state $s)"
thaw
for _ in $(seq 1 100); do
  s=$(state_of "$leftover")
  [ -z "$s" ] || [ "$s" = Z ] && break
  sleep 0.05
done
expect_no_leftovers
echo "PASS (1-3, cpprun --diagnose answered in the wait after SIGKILL)"
