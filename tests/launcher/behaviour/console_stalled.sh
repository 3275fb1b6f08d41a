# Note [A console that does not read]: cpprun's stdout is a pipe nobody reads while rank 0 prints
# without end and rank 1 fails. cpprun notices the failure at once, stops rank 0, and exits with
# rank 1's code within its 2 s patience for the console, saying how much output it dropped (it
# waited for the reader before: here 10 s). SIGTERM to such a cpprun is acted on at once too.
. "$(dirname "$0")/common.sh"

start=$(now_ms)
# The reader sleeps 10 s, then reads.
{ CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c '
    if [ "$LOCAL_RANK" = 1 ]; then sleep 2; exit 4; fi
    while :; do echo "rank 0 prints a long line that nobody reads xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; done' \
    2>"$WORK/err"; echo $? >"$WORK/rc"; now_ms >"$WORK/ended_ms"; } | { sleep 10; cat >/dev/null; }
rc=$(cat "$WORK/rc")
elapsed=$(($(cat "$WORK/ended_ms") - start))
expect_eq "$rc" 4 "exit code"
[ "$elapsed" -lt 9000 ] || fail "cpprun took ${elapsed} ms with a stalled console; it waited for the reader"
expect_in_file "$WORK/err" "exited with code 4" "root cause's exit"
expect_in_file "$WORK/err" "of the workers' output were not written: the console took nothing for 2 s" "dropped output named"

# SIGTERM while the console is stalled: handled at once (exit 143 within the patience).
{ CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=1 /bin/sh -c 'while :; do echo "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; done' \
    2>"$WORK/err2" & echo $! >"$WORK/pid"; wait; } | { sleep 8; cat >/dev/null; } &
reader=$!
sleep 2
signalled=$(now_ms)
kill -TERM "$(cat "$WORK/pid")"
for _ in $(seq 50); do kill -0 "$(cat "$WORK/pid")" 2>/dev/null || break; sleep 0.1; done
stopped=$(($(now_ms) - signalled))
kill -0 "$(cat "$WORK/pid")" 2>/dev/null && fail "cpprun still runs 5 s after SIGTERM with a stalled console"
expect_in_file "$WORK/err2" "received SIGTERM" "SIGTERM acted on"
wait "$reader" 2>/dev/null
expect_no_leftovers
echo "PASS (failure: exited after ${elapsed} ms; SIGTERM: stopped after ${stopped} ms)"
