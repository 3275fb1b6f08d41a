# (g) A worker that ignores SIGTERM is SIGKILLed once --shutdown_timeout has passed.
. "$(dirname "$0")/common.sh"

# Local rank 0 ignores SIGTERM; local rank 1 fails once rank 0 is ready, so cpprun stops the job.
# The time bounds start at rank 1's failure ($WORK/failed_ms), not before the job's start-up.
stubborn_job() {
  rm -f "$WORK/stubborn" "$WORK/failed_ms"
  cpprun --nproc_per_node=2 "$@" /bin/sh -c '
    if [ "$LOCAL_RANK" = 1 ]; then
      i=0; while [ ! -e "$WORK/stubborn" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 99; sleep 0.05; done
      date +%s%3N >"$WORK/failed_ms"
      exit 1
    fi
    trap "" TERM
    touch "$WORK/stubborn"
    exec sleep 30'
}

stubborn_job --shutdown_timeout=1
rc=$?
ended=$(now_ms)
expect_eq "$rc" 1 "exit code"
latest_mark "--shutdown_timeout=1" "$WORK/failed_ms"
elapsed=$((ended - MARK))
# At least the 1 s; and less than cpprun's default 5 s, so that the flag is seen to be used.
[ "$elapsed" -ge 1000 ] || fail "took ${elapsed} ms after the failure: SIGKILL came before --shutdown_timeout=1"
[ "$elapsed" -lt 4500 ] || fail "took ${elapsed} ms after the failure: SIGKILL did not come after --shutdown_timeout=1"
expect_in_file "$WORK/err" "did not exit within --shutdown_timeout=1s, killed by SIGKILL" "summary"

# Without the flag, torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT sets it (cpprun's own default is 5 s).
TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1 stubborn_job
rc=$?
ended=$(now_ms)
expect_eq "$rc" 1 "exit code (TORCH_ELASTIC_SHUTDOWN_TIMEOUT)"
latest_mark "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1" "$WORK/failed_ms"
env_elapsed=$((ended - MARK))
[ "$env_elapsed" -ge 1000 ] || fail "took ${env_elapsed} ms: SIGKILL came before TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1"
[ "$env_elapsed" -lt 4500 ] || fail "took ${env_elapsed} ms: TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1 was not used"
expect_in_file "$WORK/err" "did not exit within --shutdown_timeout=1s" "summary (TORCH_ELASTIC_SHUTDOWN_TIMEOUT)"
expect_no_leftovers
echo "PASS (${elapsed} ms, ${env_elapsed} ms)"
