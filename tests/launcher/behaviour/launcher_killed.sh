# (f) When cpprun is SIGKILLed its workers die too (PR_SET_PDEATHSIG), within seconds, and so does
# the workers' store keeper (Note [Store keeper] in launcher/workers/store_keeper_plan.h).
. "$(dirname "$0")/common.sh"

CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=3 /bin/sh -c \
  'echo $$ > "$WORK/pid.$LOCAL_RANK"; exec sleep 30' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/pid.0" "$WORK/pid.1" "$WORK/pid.2"
for rank in 0 1 2; do wait_for_exec "$WORK/pid.$rank" sleep 10; done  # past `echo`
keeper=$(pgrep -P "$launcher" -x cpprun-store-ke)
[ -n "$keeper" ] || fail "no cpprun-store-keeper among cpprun's children"
kill -KILL "$launcher"
wait "$launcher"
expect_eq "$?" 137 "launcher's status"
deadline=$((SECONDS + 5))
for rank in 0 1 2 keeper; do
  if [ "$rank" = keeper ]; then pid=$keeper; else pid=$(cat "$WORK/pid.$rank"); fi
  while alive "$pid"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$( [ "$rank" = keeper ] && echo "the store keeper" || echo "rank $rank") (pid $pid) outlived the launcher"
    sleep 0.05
  done
done
# SIGKILL gives cpprun no chance to remove its temp dir (it holds only empty per-rank dirs here).
ls -d "$TMPDIR"/cpprun-* >/dev/null 2>&1 || fail "expected the killed cpprun's temp dir in \$TMPDIR"
rm -rf "$TMPDIR"/cpprun-*
expect_no_leftovers_within 5  # cpprun's guardian may still be sweeping
echo PASS
