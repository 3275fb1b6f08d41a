# SIGUSR1 to cpprun is passed to every worker and does not end the job; listed in
# --signals_to_handle, SIGUSR1 or SIGUSR2 ends it as torchrun's agent does (Note [SIGUSR1 and SIGUSR2]).
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

# Listed: torchrun's _terminate_process_handler raises SignalException, its agent sends the signal to
# every worker and SIGKILL after the shutdown timeout, and its @record main writes the exception to
# the launcher's error file. Rank 1 exits at the signal, rank 0 ignores it and is killed; the job ends
# (128+signal, as cpprun ends on SIGTERM) even though no worker failed. The list's spaces are
# stripped as torchrun strips them.
for sig in USR1 USR2; do
  rm -f "$WORK"/ready.* "$WORK"/got.* "$WORK/launcher.json"
  started=$SECONDS
  TORCHELASTIC_ERROR_FILE=$WORK/launcher.json CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 \
    --shutdown_timeout=1 --signals_to_handle="SIGTERM, SIG$sig" /bin/sh -c '
    if [ "$LOCAL_RANK" = 0 ]; then trap "touch \"\$WORK/got.\$LOCAL_RANK\"" '$sig'
    else trap "touch \"\$WORK/got.\$LOCAL_RANK\"; exit 0" '$sig'; fi
    touch "$WORK/ready.$LOCAL_RANK"
    while :; do sleep 1; done' >"$WORK/out" 2>"$WORK/err" &
  launcher=$!
  wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
  kill -$sig "$launcher"
  while kill -0 "$launcher" 2>/dev/null && [ $((SECONDS - started)) -lt 20 ]; do sleep 0.1; done
  kill -0 "$launcher" 2>/dev/null && fail "the job ran on after a listed SIG$sig"
  wait "$launcher"
  code=$?
  number=$(kill -l $sig)
  expect_eq "$code" $((128 + number)) "exit code after SIG$sig listed in --signals_to_handle"
  wait_for_files 1 "$WORK/got.0" "$WORK/got.1"
  expect_in_file "$WORK/err" "received SIG$sig; forwarded it to every worker and stopped them" "the summary of a listed SIG$sig"
  expect_in_file "$WORK/launcher.json" "{\"message\": {\"message\": \"SignalException: Process $launcher got signal: $number\"" "a listed SIG$sig in the launcher's error file"
  expect_no_leftovers
done
echo PASS
