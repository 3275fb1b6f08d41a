# The flight recorder on 2 ranks under cpprun: a rank stuck in a collective dumps when it times
# out, naming the op and its number; a byte on each rank's request fd dumps every rank (the stuck
# one's collective "started", the other's last one "completed"); std::terminate dumps; bad
# settings fail at init, naming the variable.
# usage: flight_recorder.sh CPPRUN PROBE CASE   (CASE: stuck | request | terminate | bad_settings)
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: flight_recorder.sh CPPRUN PROBE CASE}
CASE=${3:?usage: flight_recorder.sh CPPRUN PROBE CASE}
DUMPS=$WORK/dumps
mkdir "$DUMPS"

run_probe() {  # MODE [VAR=VALUE...]
  local mode=$1
  shift
  env "$@" CPPRUN_FLIGHT_RECORDER_DIR="$DUMPS" CPPRUN_TEST_TAG="$WORK" \
    "$CPPRUN" --standalone --nproc_per_node=2 "$PROBE" "$mode" "$WORK" >"$WORK/out" 2>"$WORK/err"
  status=$?
}

# The dump is one JSON document (checked by python3 where there is one).
expect_valid_json() {  # file
  [ -s "$1" ] || fail "no dump at $1"
  if command -v python3 >/dev/null; then
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["format"] == "cpprun-flight-recorder"' "$1" \
      || fail "$(basename "$1") is not valid JSON: $(cat "$1")"
  fi
  [ ! -e "$1.tmp" ] || fail "$1.tmp left behind"
}

# Entry lines (one per line in the dump): the one whose "seq":N,"op":OP ... matches `text`.
expect_entry() {  # file text what
  grep -F '"group":"0","group_ranks":[0,1],' "$1" | grep -qF -- "$2" \
    || fail "$3: no entry with '$2' in $(basename "$1"): $(cat "$1")"
}

case $CASE in
stuck)
  run_probe stuck
  ended=$(now_ms)
  [ "$status" != 0 ] || fail "stuck: the job exited 0"
  grep -qF "all_reduce #3 returned" "$WORK/out" && fail "stuck: all_reduce #3 returned without rank 1"
  grep -qF "rank 0 caught: " "$WORK/err" || fail "stuck: rank 0 did not catch the timeout"
  # A send after the timeout is refused in cpprun's words, not Gloo's bare exception.
  expect_in_file "$WORK/err" "rank 0's send after the timeout: cpprun: rank 0 " "stuck: a send after the timeout"
  expect_in_file "$WORK/err" "this group timed out in an earlier call" "stuck: a send after the timeout"
  f=$DUMPS/rank_0.json
  expect_valid_json "$f"
  expect_in_file "$f" '"rank":0,"world_size":2,' "stuck: rank 0's dump header"
  expect_in_file "$f" '"reason":"timeout"' "stuck: rank 0's dump reason"
  expect_entry "$f" '"seq":1,"op":"all_reduce","dtype":"float32","shapes":[[3]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "stuck"
  expect_entry "$f" '"seq":2,"op":"all_reduce","dtype":"float32","shapes":[[3]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "stuck"
  expect_entry "$f" '"seq":3,"op":"all_reduce","dtype":"float32","shapes":[[4096]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"failed"' "stuck"
  tail -2 "$f" | head -1 | grep -qF '"seq":3,' || fail "stuck: all_reduce #3 is not the last entry: $(cat "$f")"
  # Rank 1 failed nothing: it dumps when it exits (or, if still running, when the launcher asks).
  f=$DUMPS/rank_1.json
  expect_valid_json "$f"
  grep -qE '"reason":"(exit|request)"' "$f" || fail "stuck: rank 1's dump reason: $(cat "$f")"
  expect_entry "$f" '"seq":2,"op":"all_reduce","dtype":"float32","shapes":[[3]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "stuck: rank 1"
  # The launcher's diagnosis: rank 0 failed in #3; rank 1 (asked, or exited by then) is named with #2.
  expect_in_file "$WORK/err" "cpprun: diagnosis (rank 0 (local_rank 0" "stuck: the launcher's diagnosis"
  expect_in_file "$WORK/err" "rank 0 failed in all_reduce #3 (float32[4096], sum)" "stuck: where rank 0 failed"
  expect_in_file "$WORK/err" "rank 1 finished all_reduce #2 (float32[3], sum) and called no collective" "stuck: where rank 1 is"
  # Timed from rank 0's mark just before all_reduce #3, not from the job's start.
  ended_between "stuck: rank 0 entered all_reduce #3 (3 s timeout)" "$ended" 3000 10000 "$WORK/stuck.0"
  echo "stuck: the job ended $ELAPSED ms after rank 0 entered all_reduce #3"
  ;;
request)
  # Each rank reads its own FIFO as fd 3 (opened read-write, so that opening it never blocks).
  mkfifo "$WORK/req.0" "$WORK/req.1"
  CPPRUN_FLIGHT_RECORDER_DIR="$DUMPS" CPPRUN_FLIGHT_RECORDER_REQUEST_FD=3 CPPRUN_TEST_TAG="$WORK" \
    "$CPPRUN" --standalone --nproc_per_node=2 /bin/sh -c 'exec "$0" request "$1" 3<>"$1/req.$RANK"' \
    "$PROBE" "$WORK" >"$WORK/out" 2>"$WORK/err" &
  job=$!
  wait_for_files 30 "$WORK/ready.0" "$WORK/ready.1"
  [ -z "$(ls "$DUMPS"/*.json 2>/dev/null)" ] || fail "request: dumps before any request: $(ls "$DUMPS")"
  # Each rank announced that it answers requests (the launcher asks only those).
  wait_for_files 10 "$DUMPS/rank_0.listening" "$DUMPS/rank_1.listening"
  printf x >"$WORK/req.0"
  printf x >"$WORK/req.1"
  wait_for_files 10 "$DUMPS/rank_0.json" "$DUMPS/rank_1.json"
  sleep 0.2  # each is renamed into place whole; a second byte's dump may follow the first
  for rank in 0 1; do cp "$DUMPS/rank_$rank.json" "$WORK/asked_$rank.json"; done
  touch "$WORK/release"
  wait "$job"
  status=$?
  [ "$status" = 0 ] || fail "request: the job failed (exit $status)"
  for rank in 0 1; do
    expect_in_file "$WORK/out" "[rank$rank]: request fd 3 does not reach a child" "request: close-on-exec"
    expect_in_file "$WORK/out" "[rank$rank]: all_reduce #3 gave 2" "request: all_reduce #3 after the dump"
    expect_valid_json "$WORK/asked_$rank.json"
    expect_in_file "$WORK/asked_$rank.json" "\"rank\":$rank,\"world_size\":2," "request: rank $rank's header"
    expect_in_file "$WORK/asked_$rank.json" '"reason":"request"' "request: rank $rank's reason"
    # At the end each rank left its last collectives (Note [Exit dump]): #3 completed.
    expect_in_file "$DUMPS/rank_$rank.json" '"reason":"exit"' "request: rank $rank's exit dump"
    expect_entry "$DUMPS/rank_$rank.json" '"seq":3,"op":"all_reduce","dtype":"float32","shapes":[[4096]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "request: rank $rank's exit dump"
  done
  expect_entry "$WORK/asked_0.json" '"seq":3,"op":"all_reduce","dtype":"float32","shapes":[[4096]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"started","start_unix_ms":' "request: rank 0 waits in #3"
  expect_entry "$WORK/asked_0.json" '"end_unix_ms":null}' "request: rank 0's #3 has no end"
  expect_entry "$WORK/asked_1.json" '"seq":2,"op":"all_reduce","dtype":"float32","shapes":[[3]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "request: rank 1 finished #2"
  grep -qF '"seq":3,' "$WORK/asked_1.json" && fail "request: rank 1 recorded #3 before it called it"
  ;;
terminate)
  run_probe terminate
  [ "$status" != 0 ] || fail "terminate: the job exited 0"
  f=$DUMPS/rank_0.json
  expect_valid_json "$f"
  expect_in_file "$f" '"reason":"terminate"' "terminate: rank 0's dump reason"
  expect_entry "$f" '"seq":2,"op":"all_reduce","dtype":"float32","shapes":[[3]],"reduce_op":"sum","root":null,"tag":null,"label":null,"public_call":null,"state":"completed"' "terminate"
  expect_in_file "$WORK/err" "rank 0 gives up" "terminate: the previous handler still ran"
  ;;
bad_settings)
  run_probe stuck CPPRUN_FLIGHT_RECORDER_ENTRIES=lots
  [ "$status" != 0 ] || fail "bad_settings: ENTRIES=lots: the job exited 0"
  expect_in_file "$WORK/err" 'CPPRUN_FLIGHT_RECORDER_ENTRIES="lots" is not a number of entries' "bad_settings: ENTRIES"
  # LibTorch's own (Note [LibTorch's flight-recorder variables]): its Gloo group hung or aborted.
  for bad in TORCH_FR_BUFFER_SIZE=abc TORCH_NCCL_TRACE_BUFFER_SIZE=99999999999999999999; do
    run_probe stuck "$bad"
    [ "$status" != 0 ] || fail "bad_settings: $bad: the job exited 0"
    expect_in_file "$WORK/err" "${bad%%=*} is \"${bad#*=}\", which LibTorch's process group cannot read" "bad_settings: $bad"
  done
  # cpprun itself always passes fd 3: a wrong value is set past it, as another launcher might.
  CPPRUN_FLIGHT_RECORDER_DIR="$DUMPS" CPPRUN_TEST_TAG="$WORK" "$CPPRUN" --standalone --nproc_per_node=2 \
    /bin/sh -c 'CPPRUN_FLIGHT_RECORDER_REQUEST_FD=917 exec "$0" stuck "$1"' "$PROBE" "$WORK" >"$WORK/out" 2>"$WORK/err"
  status=$?
  [ "$status" != 0 ] || fail "bad_settings: REQUEST_FD=917: the job exited 0"
  expect_in_file "$WORK/err" 'CPPRUN_FLIGHT_RECORDER_REQUEST_FD=917 names no open file descriptor' "bad_settings: REQUEST_FD"
  ;;
*) fail "unknown case $CASE" ;;
esac
expect_no_leftovers
echo PASS
