# An --master_addr (or c10d endpoint) that does not resolve fails at once, naming the flag and the
# host, instead of after the whole --rdzv_conf timeout (600 s here, far beyond this test's
# own limit). Without DNS (a private network namespace) the resolver answers "try again", which
# cpprun retries for 5 s before failing with the same message.
. "$(dirname "$0")/common.sh"

expect_unresolved() {  # what flag_text command...
  local what=$1 flag=$2
  shift 2
  CPPRUN_TEST_TAG=$WORK timeout 60 "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  [ "$rc" != 124 ] || fail "$what: cpprun was still waiting after 60 s"
  [ "$rc" = 1 ] || [ "$rc" = 2 ] || fail "$what: exit code $rc, expected 2 (no such name) or 1 (no answer)"
  expect_in_file "$WORK/err" "cpprun: cannot resolve $flag: " "$what"
  grep -qE "Name or service not known|No address associated|Temporary failure in name resolution" "$WORK/err" ||
    fail "$what: the resolver's reason is missing"
  [ ! -s "$WORK/out" ] || fail "$what: something ran"
}

expect_unresolved "one node" "--master_addr=nosuch.invalid" "$CPPRUN" --master_addr=nosuch.invalid /bin/echo ran
expect_unresolved "node 1" "--master_addr=nosuch.invalid" "$CPPRUN" --nnodes=2 --node_rank=1 --master_addr=nosuch.invalid \
  --rdzv_conf timeout=600 /bin/echo ran
# The flag that named the host, not one the user never gave: c10d's port 0 on one node (a static
# launch at that host), and static's --rdzv_endpoint.
expect_unresolved "one node, c10d port 0" "the host of --rdzv_endpoint=nosuch.invalid:0" "$CPPRUN" \
  --rdzv_backend=c10d --rdzv_endpoint=nosuch.invalid:0 /bin/echo ran
expect_unresolved "one node, static endpoint" "the host of --rdzv_endpoint=nosuch.invalid:29511" "$CPPRUN" \
  --rdzv_endpoint=nosuch.invalid:29511 /bin/echo ran
expect_unresolved "MASTER_ADDR from mpirun" "--master_addr=nosuch.invalid" \
  env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=1 MASTER_ADDR=nosuch.invalid \
  "$CPPRUN" /bin/echo ran
# Node 0 and a c10d host would listen if the check failed to stop them: only in a private namespace.
if [ "$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}')" = lo ]; then
  expect_unresolved "node 0" "--master_addr=nosuch.invalid" "$CPPRUN" --nnodes=2 --node_rank=0 --master_addr=nosuch.invalid \
    --rdzv_conf timeout=600 /bin/echo ran
  expect_unresolved "c10d" "the host of --rdzv_endpoint=nosuch.invalid:29400" "$CPPRUN" --rdzv_backend=c10d \
    --rdzv_endpoint=nosuch.invalid:29400 --rdzv_conf join_timeout=600 /bin/echo ran
else
  untried="node 0 and the c10d host not tried (they need a private network namespace: root)"
fi
expect_no_leftovers
# A partial skip is a skip (77), counted as one, never a pass with a part missing.
[ -z "${untried:-}" ] || { echo "SKIP: $untried"; exit 77; }
echo PASS
