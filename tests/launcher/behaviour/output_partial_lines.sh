# Unfinished last lines are printed when the worker exits; a line longer than 64 KiB comes out in
# prefixed pieces; a process the worker left holding its pipe does not keep cpprun waiting.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=2 /bin/sh -c 'printf "first\nno newline %s" "$RANK"; printf "err without newline" >&2'
expect_eq "$?" 0 "exit code"
expect_eq "$(grep -c . "$WORK/out")" 4 "stdout lines"
expect_in_file "$WORK/out" "[rank0]: no newline 0" "rank 0's partial line"
expect_in_file "$WORK/out" "[rank1]: no newline 1" "rank 1's partial line"
expect_eq "$(grep -cxF '[rank1]: err without newline' "$WORK/err")" 1 "stderr partial line"
expect_eq "$(tail -c1 "$WORK/out" | od -An -c | tr -d ' ')" '\n' "stdout ends with a newline"

# 200000 bytes without a newline: three 64 KiB pieces reach the console while the worker still
# waits to end the line; the rest follows with the newline.
CPPRUN_TEST_TAG=$WORK "$CPPRUN" /bin/sh -c '
  head -c 200000 /dev/zero | tr "\0" y
  while [ ! -e "$WORK/go" ]; do sleep 0.02; done
  echo; echo after' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
deadline=$((SECONDS + 20))
until [ "$(wc -l <"$WORK/out")" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the 64 KiB pieces of an unfinished line did not come out"
  sleep 0.05
done
touch "$WORK/go"
wait "$launcher"
expect_eq "$?" 0 "long line exit code"
expect_eq "$(awk '{ print length($0) }' "$WORK/out" | tr '\n' ' ')" "65545 65545 65545 3401 14 " \
  "piece lengths ('[rank0]: ' is 9 bytes)"
expect_all_lines "$WORK/out" '^\[rank0\]: (y+|after)$' "pieces prefixed"

# An orphan holding stdout open: cpprun exits when the worker does, not when the orphan does (it
# stops the orphan then: see leftover_processes.sh).
cpprun /bin/sh -c 'sleep 20 & echo started; date +%s%3N >"$WORK/exited_ms"'
status=$?
ended=$(now_ms)
expect_eq "$status" 0 "orphan exit code"
latest_mark "the worker with an orphan" "$WORK/exited_ms"  # timed from the worker's end
elapsed=$((ended - MARK))
[ "$elapsed" -lt 5000 ] || fail "took ${elapsed} ms after the worker ended: cpprun waited for the orphan's end of the pipe"
expect_in_file "$WORK/out" "[rank0]: started" "output before the orphan"
expect_no_leftovers
echo "PASS (${elapsed} ms with an orphan)"
