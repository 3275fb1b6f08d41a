# The whole process tree goes with the job: what a worker leaves behind (a `sleep 600 &`, a daemon
# that called setsid() after a double fork) is stopped when the job ends, whichever way: success,
# failure, SIGTERM to cpprun, and cpprun SIGKILLed (then by its guardian process). Every grandchild
# writes its pid to $WORK/child.*; none may be alive once cpprun is gone.
. "$(dirname "$0")/common.sh"

# Each worker leaves a background sleep in its own process group and a setsid() daemon, then does
# what $1 says: a number to exit with, "wait" to run until signalled, "fail1" for rank 1 to exit 3
# while rank 0 waits.
worker='
  sleep 600 & echo $! >"$WORK/child.bg.$LOCAL_RANK"
  setsid sh -c "sleep 600 & echo \$! >\"$WORK/child.daemon.$LOCAL_RANK\"" </dev/null >/dev/null 2>&1
  while [ ! -s "$WORK/child.daemon.$LOCAL_RANK" ]; do sleep 0.02; done
  touch "$WORK/ready.$LOCAL_RANK"
  case "$1" in
    wait) exec sleep 600 ;;
    fail1)
      [ "$LOCAL_RANK" = 1 ] || exec sleep 600
      while [ ! -e "$WORK/ready.0" ]; do sleep 0.02; done
      exit 3 ;;
    *) exit "$1" ;;
  esac'

expect_children_gone() {  # what, [seconds to wait]
  local deadline=$((SECONDS + ${2:-0})) f pid n=0
  for f in "$WORK"/child.*; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    pid=$(cat "$f")
    while alive "$pid"; do
      [ "$SECONDS" -lt "$deadline" ] || fail "$1: $(basename "$f") (pid $pid) outlived the job"
      sleep 0.05
    done
  done
  expect_eq "$n" 4 "$1: grandchildren started"
  rm -f "$WORK"/child.* "$WORK"/ready.*
}

# Success: cpprun stops the leftovers before it exits 0.
cpprun --nproc_per_node=2 /bin/sh -c "$worker" sh 0
expect_eq "$?" 0 "exit code when the workers succeed"
expect_in_file "$WORK/err" "cpprun: stopping 4 processes the workers left behind:" "leftovers named"
expect_children_gone "after success"
expect_no_leftovers

# Failure: rank 1 exits 3, rank 0 is stopped.
cpprun --nproc_per_node=2 /bin/sh -c "$worker" sh fail1
expect_eq "$?" 3 "exit code when a worker fails"
expect_children_gone "after a failure"
expect_no_leftovers

# A leftover that ignores SIGTERM is SIGKILLed after --shutdown_timeout.
cpprun --shutdown_timeout=0.5 /bin/sh -c '
  sh -c "trap \"\" TERM; echo \$\$ >\"$WORK/stubborn\"; exec sleep 600" &
  while [ ! -s "$WORK/stubborn" ]; do sleep 0.02; done'
expect_eq "$?" 0 "exit code with a stubborn leftover"
alive "$(cat "$WORK/stubborn")" && fail "a leftover ignoring SIGTERM outlived the job"
expect_no_leftovers

# SIGTERM to cpprun.
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c "$worker" sh wait >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
kill -TERM "$launcher"
wait_node "$launcher" 20
expect_eq "$NODE_STATUS" 143 "exit code after SIGTERM"
expect_children_gone "after SIGTERM to cpprun"
expect_no_leftovers

# SIGKILL to cpprun: the workers die by PR_SET_PDEATHSIG, their children by the guardian.
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c "$worker" sh wait >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
kill -KILL "$launcher"
wait "$launcher"
expect_eq "$?" 137 "cpprun's status after SIGKILL"
expect_children_gone "after SIGKILL to cpprun" 10
rm -rf "$TMPDIR"/cpprun-*  # SIGKILL gives cpprun no chance to remove its temp dir
expect_no_leftovers_within 10
echo PASS
