# cpprun --diagnose across nodes (issue 27; Note [Diagnosis on request across nodes]): a job of two
# agents on the loopback where rank 2 (node 1) is stuck in all_reduce #5 and the other ranks wait in
# all_gather #6. `cpprun --diagnose <node 0's cpprun>` prints one diagnosis naming the ranks of both
# nodes while the job goes on; twice in a row and two at once work too; asked on node 1, cpprun
# answers for node 1's ranks and says to ask node 0's. With node 1's agent stopped, node 0 names it
# after its bounded wait, and node 1's late answer, once it resumes, is not taken for the next
# request's. Then SIGTERM ends the job and nothing is left. The workers speak the recorder's protocol
# from Python (fake_recorder.py), as multi_node_diagnosis.sh's do. Agents bind 127.0.0.1 only, in a
# private network namespace.
. "$(dirname "$0")/common.sh"
require_private_netns
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
recorder="python3 $(dirname "$0")/fake_recorder.py"

# Asks cpprun $1 for a diagnosis (at most 40 s), into $WORK/$2.out and .err; the exit code in $ASKED,
# and in $ASK_MS the milliseconds from the asking (marked just before cpprun --diagnose starts)
# to its answer.
ask() {
  local ended
  rm -f "$WORK/$2.asked_ms"
  timeout 40 sh -c 'date +%s%3N >"$0"; exec "$@"' "$WORK/$2.asked_ms" "$CPPRUN" --diagnose "$1" \
    >"$WORK/$2.out" 2>"$WORK/$2.err"
  ASKED=$?
  ended=$(now_ms)
  latest_mark "$2: the request" "$WORK/$2.asked_ms"
  ASK_MS=$((ended - MARK))
}

# Fails unless $WORK/$1.out answers for every rank of both nodes: rank 2 stuck, 0, 1 and 3 waiting.
expect_whole_job() {
  local answer=$WORK/$1.out rank
  expect_in_file "$answer" "cpprun: diagnosis (asked by cpprun --diagnose from pid" "$1: the header"
  expect_in_file "$answer" "group world (ranks 0-3): rank 2 is in all_reduce #5 (float32[4096], sum) since" \
    "$1: node 1's stuck rank, in node 0's answer"
  # Each fake worker's clock starts when it does: the waiting ranks share a line when they wait since
  # the same 0.1 s.
  for rank in 0 1 3; do
    grep -qE "(ranks [-0-9, ]*wait|rank $rank waits) in all_gather #6 \(float32\[1024\]\) since" "$answer" ||
      fail "$1: rank $rank waiting in all_gather #6 is not in the answer: $(cat "$answer")"
  done
  grep -q "no dump from" "$answer" && fail "$1: a rank without a dump: $(cat "$answer")"
  return 0
}

worker='[ "$RANK" = 2 ] && exec '"$recorder"' behind; exec '"$recorder"' ahead'
common=(--nnodes=2 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29573)
start_node node0 "${common[@]}" --node_rank=0 /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 "${common[@]}" --node_rank=1 /bin/sh -c "$worker"
node1=$NODE_PID
for text in "rank 0 playing ahead" "rank 1 playing ahead"; do wait_for_text 30 "$WORK/node0.out" "$text"; done
for text in "rank 2 playing behind" "rank 3 playing ahead"; do wait_for_text 30 "$WORK/node1.out" "$text"; done

# ---- asked on node 0: one diagnosis over both nodes' ranks, the job goes on ----
ask "$node0" first
elapsed=$ASK_MS
expect_eq "$ASKED" 0 "cpprun --diagnose of node 0's exit code"
expect_whole_job first
expect_in_file "$WORK/node0.err" "rank 2 is in all_reduce #5" "node 0's console has the answer too"
expect_in_file "$WORK/node1.err" "node 0 asked for this node's ranks' flight-recorder dumps (cpprun --diagnose there, request 1)" \
  "node 1 saying it answered"
# Every node answers in milliseconds: no part of node 0's 5 s wait is spent.
[ "$elapsed" -lt 4000 ] || fail "the answer took $elapsed ms"
alive "$node0" && alive "$node1" || fail "cpprun --diagnose stopped the job"

# ---- twice in a row, then two at once ----
ask "$node0" second
expect_eq "$ASKED" 0 "the second request's exit code"
expect_whole_job second
timeout 40 "$CPPRUN" --diagnose "$node0" >"$WORK/both_a.out" 2>"$WORK/both_a.err" &
both_a=$!
timeout 40 "$CPPRUN" --diagnose "$node0" >"$WORK/both_b.out" 2>"$WORK/both_b.err" &
both_b=$!
wait "$both_a"
expect_eq $? 0 "the first of two overlapping requests' exit code"
wait "$both_b"
expect_eq $? 0 "the second of two overlapping requests' exit code"
expect_whole_job both_a
expect_whole_job both_b
alive "$node0" && alive "$node1" || fail "the repeated requests stopped the job"

# ---- asked on node 1: its own ranks, and where to ask for the whole job ----
ask "$node1" member
expect_eq "$ASKED" 0 "cpprun --diagnose of node 1's exit code"
expect_in_file "$WORK/member.out" "group world (ranks 2-3): rank 2 is in all_reduce #5 (float32[4096], sum) since" \
  "node 1's own ranks, its stuck one first"
expect_in_file "$WORK/member.out" "(node 1's ranks only: for every rank of the job, run cpprun --diagnose with the pid of node 0's cpprun, the agent hosting the rendezvous at 127.0.0.1:29573)" \
  "node 1's pointer to node 0"

# ---- node 1's agent stopped: named after node 0's bounded wait; its late answer is not the next one's ----
requests_before=$(grep -c "node 0 asked for this node's ranks" "$WORK/node1.err")
kill -STOP "$node1"
ask "$node0" silent
elapsed=$ASK_MS
expect_eq "$ASKED" 0 "the request while node 1's agent is stopped: exit code"
expect_in_file "$WORK/silent.out" "no dump from ranks 2-3 (fate unknown): node 1 sent no evidence within 5 s" \
  "node 0 names the silent node's ranks"
grep -qE "ranks 0-1 wait|rank 0 waits" "$WORK/silent.out" || fail "node 0's own ranks are not in the answer"
# At most 2 s for its own dumps (milliseconds here), then the 5 s wait: bounded.
[ "$elapsed" -lt 9000 ] || fail "node 0 took $elapsed ms to give up on node 1's answer"
[ "$elapsed" -ge 4500 ] || fail "node 0 answered after $elapsed ms: did it wait for node 1 at all?"
kill -CONT "$node1"
# Resumed, node 1 answers the request it missed; node 0 has closed it and sets the answer aside.
wait_for_text 20 "$WORK/node1.err" "(cpprun --diagnose there, request $((requests_before + 1))); sent them"
ask "$node0" after
expect_eq "$ASKED" 0 "the request after node 1 resumed: exit code"
expect_whole_job after
grep -q "sent more evidence than it has ranks\|set aside" "$WORK/node0.err" &&
  fail "node 0 took node 1's late answer for a new request's"
# Node 1 printed one diagnosis, the one asked of it: node 0's requests went back to node 0 alone.
expect_eq "$(grep -c "cpprun: diagnosis (" "$WORK/node1.err")" 1 "node 1's diagnoses on its console"
alive "$node0" && alive "$node1" || fail "the requests stopped the job"

# ---- the job is ended; nothing is left ----
kill -TERM "$node0"
wait_node "$node0" 30
expect_eq "$NODE_STATUS" 143 "node 0 after SIGTERM"
wait_node "$node1" 30
[ "$NODE_STATUS" != 0 ] || fail "node 1 exited 0 after node 0 was stopped"
expect_no_leftovers
echo PASS
