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
# SIGKILL gives cpprun no chance to remove its temp dir; the next cpprun does (Note [Stale temp dirs]
# in launcher/workers/stale_run_dirs.cpp), and touches nothing else: not a dir whose owner lives, nor
# one of another boot (a TMPDIR on NFS) or pid namespace, nor one without a record, with a record cut
# short, or not named cpprun-XXXXXX, nor a symlink or what it points to.
stale=$(ls -d "$TMPDIR"/cpprun-* 2>/dev/null)
[ -n "$stale" ] && [ -f "$stale/.cpprun-owner" ] || fail "expected the killed cpprun's temp dir, with its owner record, in \$TMPDIR"
grep -qxF "pid $launcher" "$stale/.cpprun-owner" || fail "the owner record does not name the killed cpprun (pid $launcher)"
record() {  # dir pid [boot_id] [pid namespace]
  mkdir -p "$1"
  printf 'cpprun run dir owner v1\nboot_id %s\npid_namespace %s\npid %s\nstart_time %s\n' \
    "${3:-$(cat /proc/sys/kernel/random/boot_id)}" "${4:-$(readlink /proc/self/ns/pid)}" "$2" \
    "$(sed 's/.*) //' "/proc/$2/stat" | cut -d' ' -f20)" >"$1/.cpprun-owner"
}
sleep 60 &
alive_pid=$!
record "$TMPDIR/cpprun-live01" $alive_pid
cp "$stale/.cpprun-owner" "$WORK/dead_record"
decoy_record() { mkdir -p "$1"; sed "$2" "$WORK/dead_record" >"$1/.cpprun-owner"; }
decoy_record "$TMPDIR/cpprun-boot01" 's/^boot_id .*/boot_id 00000000-0000-0000-0000-000000000000/'
decoy_record "$TMPDIR/cpprun-pidns1" 's/^pid_namespace .*/pid_namespace pid:[1]/'
decoy_record "$TMPDIR/cpprun-short1" '/^start_time/d'
decoy_record "$TMPDIR/cpprun-toolong" 's/x/x/'
decoy_record "$WORK/target" 's/x/x/'
ln -s "$WORK/target" "$TMPDIR/cpprun-link01"
mkdir "$TMPDIR/cpprun-norec1"
cpprun /bin/true
expect_eq "$?" 0 "the next cpprun"
[ -e "$stale" ] && fail "the killed cpprun's temp dir $stale is still there after the next cpprun"
expect_in_file "$WORK/err" "cpprun: removed 1 temp dir of cpprun runs that were killed: $stale" "the next cpprun's note"
for kept in cpprun-live01 cpprun-boot01 cpprun-pidns1 cpprun-short1 cpprun-toolong cpprun-norec1; do
  [ -f "$TMPDIR/$kept/.cpprun-owner" ] || [ "$kept" = cpprun-norec1 -a -d "$TMPDIR/$kept" ] || fail "$kept was removed"
done
[ -L "$TMPDIR/cpprun-link01" ] && [ -f "$WORK/target/.cpprun-owner" ] || fail "the symlink or its target was touched"
kill $alive_pid
wait $alive_pid 2>/dev/null
rm -rf "$TMPDIR"/cpprun-*
expect_no_leftovers_within 5  # cpprun's guardian may still be sweeping
echo PASS
