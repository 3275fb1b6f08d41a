# (d) --max_restarts restarts the whole group with TORCHELASTIC_RESTART_COUNT counting up.
. "$(dirname "$0")/common.sh"

# Succeeds on the third attempt.
cpprun --max_restarts=2 --nproc_per_node=2 /bin/sh -c '
  [ "$TORCHELASTIC_RESTART_COUNT" = 2 ] || exit 5
  echo "$TORCHELASTIC_MAX_RESTARTS" > "$WORK/ok.$LOCAL_RANK"'
expect_eq "$?" 0 "exit code when the last attempt succeeds"
expect_eq "$(cat "$WORK/ok.0" "$WORK/ok.1" 2>/dev/null | tr '\n' ' ')" "2 2 " "TORCHELASTIC_MAX_RESTARTS"
expect_in_file "$WORK/err" "restart 2 of --max_restarts=2" "restart notice"

# Always fails: three attempts, then the worker's own exit code.
cpprun --max-restarts 2 /bin/sh -c 'echo "$TORCHELASTIC_RESTART_COUNT" >> "$WORK/attempts"; exit 7'
expect_eq "$?" 7 "exit code when every attempt fails"
expect_eq "$(tr '\n' ' ' < "$WORK/attempts")" "0 1 2 " "attempts"
expect_in_file "$WORK/err" "giving up after 3 attempts" "final summary"
expect_no_leftovers
echo PASS
