# Note [A console that does not read]: cpprun's stdout is a pipe nobody reads while rank 0 prints
# without end and rank 1 fails. cpprun notices the failure at once, stops rank 0, and exits with
# rank 1's code within its 2 s patience for the console, saying how much output it dropped (it
# waited for the reader before: here 10 s). SIGTERM to such a cpprun is acted on at once too. Then
# cpprun's own lines on a stderr that is behind or stalled.
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
# Note [The launcher's own lines]: cpprun's own stderr goes through the same sink as the workers'.
# (1) Behind a backlog (the reader starts 1 s late), the failure summary comes after every line the
# failed worker wrote before it, as on torchrun's console (it was written ahead of the backlog).
{ CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=1 /bin/sh -c '
    i=0; while [ $i -lt 3000 ]; do echo "worker line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" >&2; i=$((i+1)); done
    echo "worker last line" >&2; exit 3' 2>&1 >/dev/null; echo $? >"$WORK/rc3"; } | { sleep 1; cat >"$WORK/err3"; }
expect_eq "$(cat "$WORK/rc3")" 3 "exit code behind a backlog"
last_worker=$(grep -n "^\[rank0\]: worker last line" "$WORK/err3" | head -1 | cut -d: -f1)
summary=$(grep -n "failed first (root cause)" "$WORK/err3" | head -1 | cut -d: -f1)
[ -n "$last_worker" ] && [ -n "$summary" ] || fail "the worker's last line or the summary missing from stderr"
[ "$summary" -gt "$last_worker" ] || fail "the summary (line $summary) came before the worker's earlier lines (last at $last_worker)"
# (2) A stderr nobody reads does not hold the launcher: a failure ends it within its patience for
# the console (it blocked in writing the summary until the reader came, 10 s).
start=$(now_ms)
{ CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=1 /bin/sh -c '
    i=0; while [ $i -lt 3000 ]; do echo "worker line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" >&2; i=$((i+1)); done
    exit 3' 2>&1 >/dev/null; echo $? >"$WORK/rc4"; now_ms >"$WORK/ended4"; } | { sleep 10; cat >/dev/null; }
expect_eq "$(cat "$WORK/rc4")" 3 "exit code with a stalled stderr"
elapsed4=$(($(cat "$WORK/ended4") - start))
[ "$elapsed4" -lt 9000 ] || fail "cpprun took ${elapsed4} ms with a stalled stderr; it waited for the reader"
expect_no_leftovers
echo "PASS (failure: exited after ${elapsed} ms; SIGTERM: stopped after ${stopped} ms)"
