# SIGUSR1 to cpprun is passed to every worker and does not end the job.
. "$(dirname "$0")/common.sh"

CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c '
  trap "touch \"\$WORK/usr1.\$LOCAL_RANK\"; exit 0" USR1
  touch "$WORK/ready.$LOCAL_RANK"
  sleep 30 & wait' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
kill -USR1 "$launcher"
wait "$launcher"
expect_eq "$?" 0 "exit code (workers exit 0 after SIGUSR1)"
wait_for_files 1 "$WORK/usr1.0" "$WORK/usr1.1"
expect_no_leftovers
echo PASS
