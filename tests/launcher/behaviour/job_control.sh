# Ctrl-Z: SIGTSTP to cpprun stops its workers (they lead sessions of their own, so the terminal's
# SIGTSTP never reaches them) and then cpprun itself; SIGCONT resumes cpprun and the workers, which
# then finish. The test shell starts cpprun in a process group of its own (set -m), as an
# interactive shell would: the kernel stops only a process group whose parent is in the same session.
# Job control is off again for the rest (a non-interactive bash that sees a job stop may leave the
# loop it is in).
. "$(dirname "$0")/common.sh"

state() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

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
for pid in $workers $launcher; do
  while [ "$(state "$pid")" != T ]; do
    [ "$SECONDS" -lt "$deadline" ] ||
      fail "pid $pid is in state '$(state "$pid")', not stopped (T), after SIGTSTP to cpprun (cpprun $launcher: $(state "$launcher"), workers $workers: $(for w in $workers; do state "$w"; done | tr '\n' ' '))"
    sleep 0.05
  done
done
# Stopped, the workers make no progress (a check that can only err towards passing under load).
before=$(cat "$WORK"/count.* | wc -l)
sleep 1
expect_eq "$(cat "$WORK"/count.* | wc -l)" "$before" "lines the stopped workers wrote in 1 s"
for pid in $workers $launcher; do expect_eq "$(state "$pid")" T "state of pid $pid while stopped"; done

touch "$WORK/release"
kill -CONT "$launcher"
wait_node "$launcher" 30
expect_eq "$NODE_STATUS" 0 "exit code after SIGCONT"
expect_eq "$(grep -c '^\[rank[01]\]: finished$' "$WORK/out")" 2 "workers that finished"
expect_no_leftovers
echo PASS
