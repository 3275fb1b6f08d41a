# Restarts back off: a worker that fails at once is restarted after growing waits (--restart_backoff
# INITIAL doubling up to MAX), the doubling starts over after an attempt that ran MAX seconds, and a
# signal during a wait ends the job at once without another attempt. Timings are lower bounds only.
. "$(dirname "$0")/common.sh"

# (1) Four quick failures: waits of 0.3, 0.6 and 1.2 s (MAX=20 is far above any attempt's length,
# so no attempt counts as healthy, however loaded the machine).
cpprun --max_restarts=3 --restart_backoff=0.3:20 /bin/sh -c 'date +%s%3N >>"$WORK/starts"; exit 3'
expect_eq "$?" 3 "exit code after the restarts ran out"
expect_in_file "$WORK/err" "restarting in 0.3 s (restart 1 of --max_restarts=3; --restart_backoff=0.3:20" "first wait"
expect_in_file "$WORK/err" "restarting in 0.6 s (restart 2 of --max_restarts=3" "second wait"
expect_in_file "$WORK/err" "restarting in 1.2 s (restart 3 of --max_restarts=3" "third wait"
expect_in_file "$WORK/err" "giving up after 4 attempts" "final summary"
set -- $(cat "$WORK/starts")
expect_eq "$#" 4 "attempts started"
previous=$1
shift
for wait_ms in 300 600 1200; do
  gap=$(($1 - previous))
  [ "$gap" -ge "$wait_ms" ] || fail "attempts $previous and $1 were $gap ms apart, less than the ${wait_ms} ms wait"
  previous=$1
  shift
done

# (2) The default waits 1 s before the first restart.
rm -f "$WORK/starts"
cpprun --max_restarts=1 /bin/sh -c 'date +%s%3N >>"$WORK/starts"; exit 4'
expect_eq "$?" 4 "exit code with the default backoff"
expect_in_file "$WORK/err" "restarting in 1 s (restart 1 of --max_restarts=1; --restart_backoff=1:30" "default wait"
set -- $(cat "$WORK/starts")
[ $(($2 - $1)) -ge 1000 ] || fail "the default backoff waited $(($2 - $1)) ms, less than 1 s"

# (3) A healthy attempt starts the doubling over: attempt 1 runs 0.7 s, longer than MAX=0.5, so the
# wait after it is INITIAL again (0.2 s, not 0.4 s); the quick failure after that doubles it.
cpprun --max_restarts=3 --restart_backoff=0.2:0.5 /bin/sh -c '
  [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && sleep 0.7
  exit 5'
expect_eq "$?" 5 "exit code with a healthy attempt"
expect_in_file "$WORK/err" "restarting in 0.2 s (restart 1 of" "wait after the first quick failure"
expect_in_file "$WORK/err" "restarting in 0.2 s (restart 2 of" "wait after the healthy attempt"
grep -qF "restarting in 0.4 s (restart 2 of" "$WORK/err" && fail "the healthy attempt did not reset the backoff"

# (4) --restart_backoff=0: torchrun's immediate restarts, and no waiting line.
cpprun --max_restarts=2 --restart_backoff=0 /bin/sh -c 'exit 6'
expect_eq "$?" 6 "exit code without backoff"
grep -qF "restarting in" "$WORK/err" && fail "--restart_backoff=0 still waited"
expect_in_file "$WORK/err" "restarting all workers (restart 2 of --max_restarts=2" "restarts without backoff"

# (5) SIGTERM and SIGHUP during a 60 s wait end the job at once, exit 128+signal, no new attempt.
# (Not SIGINT: a non-interactive shell starts background jobs with it ignored, and cpprun keeps it so.)
for sig in TERM HUP; do
  rm -f "$WORK/starts"
  # start_node empties the output files first, so the wait below cannot read the previous round's.
  start_node waiting --max_restarts=5 --restart_backoff=60 /bin/sh -c 'date +%s%3N >>"$WORK/starts"; exit 3'
  launcher=$NODE_PID
  wait_for_text 20 "$WORK/waiting.err" "restarting in 60 s (restart 1 of --max_restarts=5"
  kill -"$sig" "$launcher"
  wait_node "$launcher" 15  # far below the 60 s wait
  expected=143
  [ "$sig" = HUP ] && expected=129
  expect_eq "$NODE_STATUS" "$expected" "exit code after SIG$sig during the wait"
  expect_in_file "$WORK/waiting.err" "received SIG$sig while waiting to restart; exiting with code $expected" \
    "SIG$sig message"
  expect_eq "$(wc -l <"$WORK/starts")" 1 "attempts after SIG$sig during the wait"
done

# (6) cpprun --diagnose during the wait is answered at once, saying when the workers restart (it
# went unanswered, the requester waiting out its own 30 s), and the wait goes on.
start_node waiting --max_restarts=5 --restart_backoff=60 /bin/sh -c 'exit 3'
launcher=$NODE_PID
wait_for_text 20 "$WORK/waiting.err" "restarting in 60 s (restart 1 of --max_restarts=5"
timeout 20 "$CPPRUN" --diagnose "$launcher" >"$WORK/asked.out" 2>&1
expect_eq "$?" 0 "cpprun --diagnose's exit code during the wait (answered)"
expect_in_file "$WORK/asked.out" "no worker runs; cpprun restarts them in" "the answer during the wait"
kill -0 "$launcher" 2>/dev/null || fail "the question ended the wait"
kill -TERM "$launcher"
wait_node "$launcher" 15
expect_no_leftovers
echo PASS
