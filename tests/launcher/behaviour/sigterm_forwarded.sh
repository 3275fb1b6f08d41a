# (e) SIGTERM to cpprun reaches every worker; cpprun then exits 128+15 without restarting.
. "$(dirname "$0")/common.sh"

CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 --max_restarts=3 /bin/sh -c '
  trap "echo \$TORCHELASTIC_RESTART_COUNT > \"\$WORK/term.\$LOCAL_RANK\"; exit 0" TERM
  touch "$WORK/ready.$LOCAL_RANK"
  sleep 30 & wait' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
kill -TERM "$launcher"
wait "$launcher"
expect_eq "$?" 143 "exit code"
for rank in 0 1; do
  expect_eq "$(cat "$WORK/term.$rank" 2>/dev/null)" 0 "rank $rank got SIGTERM (in the first attempt)"
done
expect_in_file "$WORK/err" "received SIGTERM" "summary"
# Workers that exit because of the forwarded signal were stopped; none of them is a root cause.
! grep -q "root cause" "$WORK/err" || fail "a stopped worker was reported as the root cause"
expect_no_leftovers
echo PASS
