# Mismatched collectives fail on every rank with one message naming the collective's number and
# each rank's call, under TORCH_DISTRIBUTED_DEBUG=DETAIL and, for what the default mode checks,
# without it; ranks that disagree on WORLD_SIZE, or share a RANK, fail at join naming it; and a
# single-node job's store (the agent's store keeper's) listens on the loopback only.
# usage: consistency.sh CPPRUN PROBE CASE   (CASE: detail | default | unchecked | join_disagreement |
#        store_loopback)
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: consistency.sh CPPRUN PROBE CASE}
CASE=${3:?usage: consistency.sh CPPRUN PROBE CASE}

# Runs the probe's MODE on 2 ranks with the given environment assignments; exit status in $status.
run_probe() {  # MODE [VAR=VALUE...]
  local mode=$1
  shift
  rm -f "$WORK"/failed.* "$WORK"/store_port "$WORK"/inspected
  env "$@" CPPRUN_TEST_TAG="$WORK" "$CPPRUN" --standalone --nproc_per_node=2 "$PROBE" "$mode" "$WORK" \
    >"$WORK/out" 2>"$WORK/err"
  status=$?
}

# Every rank failed, and printed `text` (a fixed string) itself.
expect_every_rank_failed_with() {  # text what
  [ "$status" != 0 ] || fail "$2: the job exited 0"
  grep -q '^\[rank[0-9]*\]: result' "$WORK/out" && fail "$2: a rank returned a result"
  for rank in 0 1; do
    [ -e "$WORK/failed.$rank" ] || fail "$2: rank $rank did not catch an error"
    grep -F "[rank$rank]: rank $rank caught: " "$WORK/err" | grep -qF -- "$1" \
      || fail "$2: rank $rank's error does not say '$1'"
  done
}

case $CASE in
detail)
  run_probe broadcast_size TORCH_DISTRIBUTED_DEBUG=DETAIL
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called broadcast(float32[4], root 0), rank 1 called broadcast(float32[8], root 0)." "DETAIL, broadcast of 4 and 8 elements"
  run_probe op TORCH_DISTRIBUTED_DEBUG=detail
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called broadcast(float32[4], root 0)." "DETAIL, all_reduce against broadcast"
  run_probe dtype TORCH_DISTRIBUTED_DEBUG=DETAIL
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float64[4], sum)." "DETAIL, float32 against float64"
  run_probe reduce_scatter_op TORCH_DISTRIBUTED_DEBUG=DETAIL
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called reduce_scatter(float32[4], float32[8], sum), rank 1 called reduce_scatter(float32[4], float32[8], max)." "DETAIL, sum against max"
  ;;
default)
  # What the default mode checks (docs/process_groups.md, "Collectives"): all-reduces and
  # broadcasts over Gloo, and our ring all-gather / reduce-scatter between neighbours.
  run_probe all_reduce_op
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float32[4], max)." "default, all_reduce sum against max"
  run_probe all_reduce_size
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float32[8], sum)." "default, all_reduce of 4 and 8 elements"
  run_probe dtype
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called all_reduce(float64[4], sum)." "default, all_reduce float32 against float64"
  run_probe op
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_reduce(float32[4], sum), rank 1 called broadcast(float32[4], root 0)." "default, all_reduce against broadcast"
  run_probe broadcast_size TORCH_DISTRIBUTED_DEBUG=OFF
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called broadcast(float32[4], root 0), rank 1 called broadcast(float32[8], root 0)." "default, broadcast of 4 and 8 elements"
  run_probe broadcast_size_root_larger
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called broadcast(float32[8], root 0), rank 1 called broadcast(float32[4], root 0)." "default, broadcast of 8 and 4 elements"
  run_probe all_gather_size
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called all_gather_into(float32[8], float32[4]), rank 1 called all_gather_into(float32[16], float32[8])." "default, all-gather of 4 and 8 elements"
  run_probe reduce_scatter_op
  expect_every_rank_failed_with "cpprun: collective #3 mismatch: rank 0 called reduce_scatter(float32[4], float32[8], sum), rank 1 called reduce_scatter(float32[4], float32[8], max)." "default, reduce-scatter sum against max"
  # A rank in a public call alone: the message says which call each rank was in.
  run_probe save_alone
  expect_every_rank_failed_with "rank 0 called all_reduce(int32[2], sum) in cpprun::save_state_dict, rank 1 called" "default, a save on one rank"
  expect_every_rank_failed_with "all_reduce(float32[10], sum) in DistributedDataParallel's backward." "default, a save on one rank"
  # The object collectives name themselves: their size exchange was "broadcast(int64[2], root 0)",
  # a call the user never made.
  run_probe object_against_tensor
  expect_every_rank_failed_with "rank 0 called broadcast(int64[2], root 0) in cpprun::broadcast_object, rank 1 called all_reduce(float32[4], sum)" "default, an object against a tensor"
  ;;
unchecked)
  # CPPRUN_CHECK_COLLECTIVES=0 turns the default mode's checks off: sum against max is then the
  # silent wrong result the check exists for.
  run_probe all_reduce_op CPPRUN_CHECK_COLLECTIVES=0
  [ "$status" = 0 ] || fail "unchecked: sum against max failed (exit $status) with the check off"
  grep -q '^\[rank0\]: result' "$WORK/out" || fail "unchecked: rank 0 printed no result"
  run_probe all_reduce_op CPPRUN_CHECK_COLLECTIVES=yes
  [ "$status" != 0 ] || fail "unchecked: CPPRUN_CHECK_COLLECTIVES=yes was accepted"
  expect_in_file "$WORK/err" 'CPPRUN_CHECK_COLLECTIVES="yes" must be 1' "unchecked: a bad value"
  ;;
join_disagreement)
  # Workers started by hand (no launcher keeps them consistent): WORLD_SIZE 2 on one, 3 on the other;
  # then two with RANK=1. Every rank fails within seconds, naming what disagrees.
  free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  run_rank() {  # NAME RANK WORLD_SIZE
    env RANK="$2" WORLD_SIZE="$3" LOCAL_RANK="$2" LOCAL_WORLD_SIZE="$3" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
      CPPRUN_TEST_TAG="$WORK" timeout -k 5 60 "$PROBE" op "$WORK" >"$WORK/$1.out" 2>"$WORK/$1.err"
  }
  port=$(free_port)
  rm -f "$WORK"/joining.*
  run_rank a 0 2 & a=$!
  run_rank b 1 3 & b=$!
  wait "$a"; status_a=$?
  wait "$b"; status_b=$?
  ended=$(now_ms)
  [ "$status_a" != 0 ] && [ "$status_b" != 0 ] || fail "WORLD_SIZE 2 and 3: exit codes $status_a and $status_b"
  for name in a b; do
    grep -F "cpprun: the ranks disagree on WORLD_SIZE" "$WORK/$name.err" | grep -F "WORLD_SIZE=3" | grep -qF "WORLD_SIZE=2" \
      || fail "WORLD_SIZE 2 and 3: $name's error does not name both values: $(cat "$WORK/$name.err")"
  done
  # Timed from the later process's joining.PID mark, just before it joins: start-up is left out.
  marks=("$WORK"/joining.*)
  [ "${#marks[@]}" = 2 ] || fail "WORLD_SIZE 2 and 3: ${#marks[@]} joining marks, not 2"
  latest_mark "WORLD_SIZE 2 and 3" "${marks[@]}"
  elapsed=$((ended - MARK))
  [ "$elapsed" -lt 15000 ] || fail "WORLD_SIZE 2 and 3: took $elapsed ms after both joined"
  echo "WORLD_SIZE 2 and 3: both failed $elapsed ms after the later one began to join"
  port=$(free_port)
  run_rank a 0 3 & a=$!
  run_rank b 1 3 & b=$!
  run_rank c 1 3 & c=$!
  for p in "$a" "$b" "$c"; do wait "$p" && fail "two RANK=1: a process exited 0"; done
  for name in a b c; do
    expect_in_file "$WORK/$name.err" "cpprun: two processes have RANK=1 (of WORLD_SIZE=3)" "two RANK=1: $name"
  done
  ;;
store_loopback)
  CPPRUN_TEST_TAG="$WORK" "$CPPRUN" --standalone --nproc_per_node=2 "$PROBE" store_binding "$WORK" \
    >"$WORK/out" 2>"$WORK/err" &
  job=$!
  wait_for_files 60 "$WORK/store_port"
  port=$(cat "$WORK/store_port")
  hex=$(printf '%04X' "$port")
  # /proc/net/tcp{,6}: "local_address" is ADDR:PORT in hex, state 0A is LISTEN.
  listeners=$(awk -v p="$hex" '$4 == "0A" { split($2, a, ":"); if (a[2] == p) print a[1] }' \
                /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  command -v ss >/dev/null && ss -ltn "sport = :$port"
  touch "$WORK/inspected"
  wait "$job"
  status=$?
  [ -n "$listeners" ] || fail "nothing listens on the store's port $port"
  for address in $listeners; do
    case $address in
      0100007F) ;;  # 127.0.0.1
      00000000 | 00000000000000000000000000000000)
        fail "the store listens on every interface (port $port, address $address)" ;;
      *) fail "the store listens on $address:$port, not 127.0.0.1" ;;
    esac
  done
  [ "$status" = 0 ] || fail "the store_binding job failed (exit $status)"
  ;;
*) fail "unknown case $CASE" ;;
esac
expect_no_leftovers
echo PASS
