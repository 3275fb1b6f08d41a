# (g) A worker that ignores SIGTERM is SIGKILLed once --shutdown_timeout has passed.
. "$(dirname "$0")/common.sh"

start=$(now_ms)
cpprun --nproc_per_node=2 --shutdown_timeout=1 /bin/sh -c '
  if [ "$LOCAL_RANK" = 1 ]; then
    i=0; while [ ! -e "$WORK/stubborn" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 99; sleep 0.05; done
    exit 1
  fi
  trap "" TERM
  touch "$WORK/stubborn"
  exec sleep 30'
rc=$?
elapsed=$(( $(now_ms) - start ))
expect_eq "$rc" 1 "exit code"
[ "$elapsed" -ge 1000 ] || fail "took ${elapsed} ms: SIGKILL came before --shutdown_timeout=1"
[ "$elapsed" -lt 8000 ] || fail "took ${elapsed} ms: SIGKILL did not come after --shutdown_timeout=1"
expect_in_file "$WORK/err" "did not exit within --shutdown_timeout=1s, killed by SIGKILL" "summary"
expect_no_leftovers
echo "PASS (${elapsed} ms)"
