# Ctrl-Z: SIGTSTP to cpprun stops its workers (they lead sessions of their own, so the terminal's
# SIGTSTP never reaches them) and then cpprun itself; SIGCONT resumes cpprun and the workers, which
# then finish. The test shell starts cpprun in a process group of its own (set -m), as an
# interactive shell would: the kernel stops only a process group whose parent is in the same session.
# Job control is off again for the rest (a non-interactive bash that sees a job stop may leave the
# loop it is in).
. "$(dirname "$0")/common.sh"

state() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

# Whether every process of process group $1 is stopped. dash (/bin/sh) starts `sleep` with vfork():
# a SIGSTOP to the group that lands between vfork() and exec() stops the child before it execs,
# and its parent, the worker, then waits for it in the kernel's vfork wait, which /proc shows as D
# (TASK_KILLABLE), until SIGCONT: stopped in effect, never T. Such a D parent counts as stopped
# only with a stopped child in its group; a zombie (a child that exited just before, which its
# stopped parent has not reaped) is not running either; any other state (R, S, a D without a
# stopped child) is.
# (Under `ctest -j2` this once failed the test: "a worker 10 s in state D after SIGTSTP".)
group_stopped() {  # pgid
  local f s pid rest
  local -a fields
  local listing=""
  for f in /proc/[0-9]*/stat; do
    { read -r s <"$f"; } 2>/dev/null || continue
    pid=${s%% *}
    rest=${s##*) }
    read -r -a fields <<<"$rest"  # state ppid pgrp ...
    [ "${fields[2]}" = "$1" ] && listing+="$pid ${fields[0]} ${fields[1]}"$'\n'
  done
  [ -n "$listing" ] || return 1
  printf '%s' "$listing" | awk '
    { state[$1] = $2; parent[$1] = $3 }
    END {
      for (p in state) if (state[p] == "T" || state[p] == "t") stopped_child_of[parent[p]] = 1
      for (p in state) {
        if (state[p] == "T" || state[p] == "t" || state[p] == "Z") continue
        if (state[p] == "D" && (p in stopped_child_of)) continue
        exit 1
      }
    }'
}
describe_group() {  # pgid: "pid:state ..." of its processes
  local f s
  for f in /proc/[0-9]*/stat; do
    { read -r s <"$f"; } 2>/dev/null || continue
    local rest=${s##*) }
    local -a fields
    read -r -a fields <<<"$rest"
    [ "${fields[2]}" = "$1" ] && printf '%s:%s ' "${s%% *}" "${fields[0]}"
  done
}

# Each worker counts in steps of 0.1 s, one line per step, until the test releases it: so it cannot
# finish before the test has looked, however slowly the test runs.
set -m
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c '
  echo $$ >"$WORK/pid.$LOCAL_RANK"
  i=0; until [ -e "$WORK/release" ]; do i=$((i+1)); echo $i >>"$WORK/count.$LOCAL_RANK"; sleep 0.1; done
  echo finished' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
set +m
[ "$(ps -o pgid= -p "$launcher" | tr -d ' ')" = "$launcher" ] || fail "cpprun did not get a process group of its own"
wait_for_files 20 "$WORK/count.0" "$WORK/count.1"
workers="$(cat "$WORK/pid.0") $(cat "$WORK/pid.1")"

kill -TSTP "$launcher"
deadline=$((SECONDS + 10))
for pid in $workers; do  # each worker leads its own process group
  until group_stopped "$pid"; do
    [ "$SECONDS" -lt "$deadline" ] ||
      fail "worker $pid's process group is not stopped 10 s after SIGTSTP to cpprun: $(describe_group "$pid")(cpprun $launcher: $(state "$launcher"))"
    sleep 0.05
  done
done
while [ "$(state "$launcher")" != T ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "cpprun $launcher is in state '$(state "$launcher")', not stopped (T), 10 s after SIGTSTP"
  sleep 0.05
done
# Stopped, the workers make no progress (a check that can only err towards passing under load).
before=$(cat "$WORK"/count.* | wc -l)
sleep 1
expect_eq "$(cat "$WORK"/count.* | wc -l)" "$before" "lines the stopped workers wrote in 1 s"
for pid in $workers; do group_stopped "$pid" || fail "worker $pid's group while stopped: $(describe_group "$pid")"; done
expect_eq "$(state "$launcher")" T "state of cpprun while stopped"

touch "$WORK/release"
kill -CONT "$launcher"
wait_node "$launcher" 30
expect_eq "$NODE_STATUS" 0 "exit code after SIGCONT"
expect_eq "$(grep -c '^\[rank[01]\]: finished$' "$WORK/out")" 2 "workers that finished"
expect_no_leftovers
echo PASS
