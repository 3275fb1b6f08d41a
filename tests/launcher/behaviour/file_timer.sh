# TORCHELASTIC_ENABLE_FILE_TIMER=1: workers get TORCHELASTIC_TIMER_FILE, a pipe where torch's
# FileTimerClient writes JSON requests; a worker whose timer expires gets the request's signal, and the
# job fails as for any killed worker. A released timer kills nothing; unset, there is no pipe.
. "$(dirname "$0")/common.sh"


# A timer that expires at once: the worker is killed by its signal (SIGKILL, FileTimerClient's default).
TORCHELASTIC_ENABLE_FILE_TIMER=1 cpprun --nproc_per_node=2 /bin/bash -c '
  [ -p "$TORCHELASTIC_TIMER_FILE" ] || { echo "no pipe at $TORCHELASTIC_TIMER_FILE"; exit 9; }
  echo "$TORCHELASTIC_TIMER_FILE" > "$WORK/pipe.$RANK"
  if [ "$RANK" = 1 ]; then
    printf "{\"version\": 1, \"pid\": %s, \"scope_id\": \"step\", \"expiration_time\": %s, \"signal\": 9}\n" \
      $$ "$(date +%s.%N)" > "$TORCHELASTIC_TIMER_FILE"
    sleep 20; exit 0
  fi
  sleep 20'
expect_eq "$?" 137 "exit code of the job whose worker's timer expired"
expect_in_file "$WORK/err" "file timer (TORCHELASTIC_ENABLE_FILE_TIMER): step of pid" "file-timer message"
expect_in_file "$WORK/err" "expired; sending SIGKILL" "signal named"
expect_in_file "$WORK/err" "rank 1 (local_rank 1" "root cause"
pipe=$(cat "$WORK/pipe.0")
expect_eq "$(cat "$WORK/pipe.1")" "$pipe" "one pipe for all workers"
case $pipe in "$TMPDIR"/watchdog_timer_*) ;; *) fail "pipe $pipe is not \$TMPDIR/watchdog_timer_UUID" ;; esac
[ ! -e "$pipe" ] || fail "the pipe $pipe was left behind"

# TORCHELASTIC_TIMER_FILE chooses the path; a timer acquired and released, or far away, kills nothing.
TORCHELASTIC_ENABLE_FILE_TIMER=1 TORCHELASTIC_TIMER_FILE=$WORK/timer cpprun /bin/bash -c '
  [ "$TORCHELASTIC_TIMER_FILE" = "$WORK/timer" ] && [ -p "$WORK/timer" ] || exit 9
  now=$(date +%s)
  printf "{\"version\": 1, \"pid\": %s, \"scope_id\": \"a\", \"expiration_time\": %s, \"signal\": 9}\n" \
    $$ $((now + 1)) > "$TORCHELASTIC_TIMER_FILE"
  printf "{\"version\": 1, \"pid\": %s, \"scope_id\": \"b\", \"expiration_time\": %s, \"signal\": 9}\n" \
    $$ $((now + 60)) > "$TORCHELASTIC_TIMER_FILE"
  printf "{\"version\": 1, \"pid\": %s, \"scope_id\": \"a\", \"expiration_time\": -1, \"signal\": 0}\n" \
    $$ > "$TORCHELASTIC_TIMER_FILE"
  sleep 2'
expect_eq "$?" 0 "exit code with released and distant timers"
grep -q "file timer" "$WORK/err" && fail "a timer fired"

# A request naming a process outside the job is not acted on.
sleep 30 &
outsider=$!
TORCHELASTIC_ENABLE_FILE_TIMER=1 cpprun /bin/bash -c "
  printf '{\"version\": 1, \"pid\": $outsider, \"scope_id\": \"x\", \"expiration_time\": 1, \"signal\": 9}\n' \
    > \"\$TORCHELASTIC_TIMER_FILE\"
  sleep 0.5"
expect_eq "$?" 0 "exit code after a request for an outsider"
kill -0 "$outsider" 2>/dev/null || fail "a process outside the job was signalled"
kill "$outsider"

# Without the variable: no pipe.
cpprun /bin/sh -c '[ -z "${TORCHELASTIC_TIMER_FILE:-}" ]'
expect_eq "$?" 0 "no TORCHELASTIC_TIMER_FILE without TORCHELASTIC_ENABLE_FILE_TIMER"
expect_no_leftovers
echo PASS
