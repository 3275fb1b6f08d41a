# (b) One worker exits 3 while the others sleep: cpprun stops them at once and exits 3. The failing
# worker leaves a child behind in its process group, which must not survive either.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=3 /bin/sh -c '
  if [ "$LOCAL_RANK" = 1 ]; then
    # Fail only once the sleepers are up, so stopping them is really exercised.
    i=0; while [ ! -e "$WORK/up.0" ] || [ ! -e "$WORK/up.2" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 99; sleep 0.05; done
    sleep 30 &  # an orphan once this worker exits
    date +%s%3N >"$WORK/failed_ms"
    exit 3
  fi
  touch "$WORK/up.$LOCAL_RANK"
  exec sleep 30'
rc=$?
ended=$(now_ms)
expect_eq "$rc" 3 "exit code"
# From rank 1's failure, not the job's start; under the 5 s of the default --shutdown_timeout, so
# the sleepers must have gone at SIGTERM.
latest_mark "the failing worker" "$WORK/failed_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms after the failure; the sleepers were not stopped promptly"
expect_in_file "$WORK/err" "rank 1 (local_rank 1" "root cause named"
expect_in_file "$WORK/err" "exited with code 3" "root cause's exit"
expect_in_file "$WORK/err" "killed by SIGTERM" "stopped workers listed"
expect_no_leftovers
echo "PASS (${elapsed} ms after the failure)"
