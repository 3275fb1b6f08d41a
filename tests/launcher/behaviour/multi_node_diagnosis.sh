# Multi-node diagnosis (issue 27; Note [One diagnosis for several nodes]): a rank on node 1 fails in a
# collective while node 0's ranks wait in it; node 1 sends its ranks' flight-recorder evidence to node
# 0 over the agents' link, and node 0 prints one diagnosis naming the ranks of both nodes and writes
# it to its log dir; node 1 prints one line saying so. A node that sends nothing (its agent stopped)
# is named after node 0's bounded wait, and the job still ends cleanly when it resumes. Node 0 prints
# the diagnosis also when its own workers had all succeeded before node 1's failed. The workers speak the recorder's protocol from Python
# (fake_recorder.py), as diagnosis.sh's do. Loopback only, in a private network namespace.
. "$(dirname "$0")/common.sh"
require_private_netns
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
recorder="python3 $(dirname "$0")/fake_recorder.py"

# ---- rank 2 (node 1) fails in all_gather #6; ranks 0-1 (node 0) wait there; rank 3 is behind in #5 ----
worker='case $RANK in 2) exec '"$recorder"' fails;; 3) exec '"$recorder"' behind;; *) exec '"$recorder"' ahead;; esac'
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29570 --log_dir "$WORK/logs0" \
  /bin/sh -c "$worker"
node0=$NODE_PID
FAIL_ON=$WORK/go.1 start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_port=29570 \
  --log_dir "$WORK/logs1" /bin/sh -c "$worker"
node1=$NODE_PID
# Rank 2 fails once the others are up and answer requests (each says so): an event, not a delay.
for text in "rank 0 playing ahead" "rank 1 playing ahead"; do wait_for_text 30 "$WORK/node0.out" "$text"; done
wait_for_text 30 "$WORK/node1.out" "rank 3 playing behind"
touch "$WORK/go.1"
wait_node "$node0" 40
expect_eq "$NODE_STATUS" 3 "node 0's exit code"
wait_node "$node1" 40
expect_eq "$NODE_STATUS" 3 "node 1's exit code"
expect_in_file "$WORK/node0.err" "cpprun: diagnosis (rank 2 (local_rank 0, pid" "node 0's diagnosis header"
expect_in_file "$WORK/node0.err" "on node 1 exited with code 3), from the ranks' flight recorders:" \
  "node 0's diagnosis names the failure on node 1"
expect_in_file "$WORK/node0.err" "group world (ranks 0-3): rank 3 is in all_reduce #5 (float32[4096], sum) since" \
  "node 1's rank behind, in node 0's diagnosis"
# Each fake worker's clock starts when it does: ranks 0 and 1 share a line when they wait since the same 0.1 s.
for rank in 0 1; do
  grep -qE "(ranks 0-1 wait|rank $rank waits) in all_gather #6 \(float32\[1024\]\) since" "$WORK/node0.err" ||
    fail "node 0's rank $rank waiting in all_gather #6: not in node0.err"
done
expect_in_file "$WORK/node0.err" "rank 2 failed in all_gather #6 (float32[1024]) (then exited with code 3)" \
  "node 1's failed rank, in node 0's diagnosis"
[ "$(grep -c "cpprun: diagnosis (" "$WORK/node0.err")" = 1 ] || fail "node 0 printed more than one diagnosis"
grep -q "cpprun: diagnosis (" "$WORK/node1.err" && fail "node 1 printed a diagnosis of its own"
expect_in_file "$WORK/node1.err" "this node's ranks' flight-recorder dumps went to node 0" "node 1's pointer to node 0"
json=$(ls "$WORK"/logs0/*/attempt_0/diagnosis.json 2>/dev/null)
[ -n "$json" ] || fail "no diagnosis.json in node 0's log dir: $(find "$WORK/logs0")"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
ranks = {r["rank"]: r for g in d["groups"] for r in g["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3], ranks
assert ranks[2]["state"] == "failed" and ranks[3]["seq"] == 5, ranks
assert "on node 1" in d["why"], d["why"]' "$json" || fail "node 0's diagnosis.json: $(cat "$json")"
expect_no_leftovers

# ---- node 1's agent is stopped (SIGSTOP) and sends nothing: node 0 names it after its 5 s wait ----
worker='[ "$RANK" = 0 ] && exec '"$recorder"' fails; exec '"$recorder"' ahead'
FAIL_ON=$WORK/go.2 FAULT_MARK=$WORK/failed_ms start_node node0 --nnodes=2 --node_rank=0 --master_port=29571 \
  /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 --nnodes=2 --node_rank=1 --master_port=29571 /bin/sh -c "$worker"
node1=$NODE_PID
wait_for_text 30 "$WORK/node0.out" "rank 0 playing fails"
wait_for_text 30 "$WORK/node1.out" "rank 1 playing ahead"
kill -STOP "$node1"
touch "$WORK/go.2"  # rank 0 fails now, with node 1's agent stopped
wait_for_text 30 "$WORK/node0.err" "node 1 sent no evidence within 5 s"
ended=$(now_ms)
expect_in_file "$WORK/node0.err" "no dump from rank 1 (fate unknown): node 1 sent no evidence within 5 s" \
  "node 0 names the silent node's rank"
expect_in_file "$WORK/node0.err" "rank 0 failed in all_gather #6" "node 0's own rank, in the same diagnosis"
# From rank 0's failure: at most 2 s for dumps (milliseconds here), then the 5 s wait: bounded,
# and not shorter than the wait.
latest_mark "rank 0's failure" "$WORK/failed_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -ge 5000 ] || fail "node 0 gave up on node 1's evidence $elapsed ms after the failure, before its 5 s wait"
[ "$elapsed" -lt 10000 ] || fail "node 0 took $elapsed ms after the failure to give up on node 1's evidence"
# Resumed, node 1 stops its workers and the job ends as usual; its evidence, late, changes nothing.
kill -CONT "$node1"
wait_node "$node0" 30
expect_eq "$NODE_STATUS" 3 "node 0's exit code"
wait_node "$node1" 30
expect_eq "$NODE_STATUS" 3 "node 1's exit code"
[ "$(grep -c "cpprun: diagnosis (" "$WORK/node0.err")" = 1 ] || fail "node 0 printed more than one diagnosis"
expect_no_leftovers

# ---- node 0's workers all succeed; then rank 1 (node 1) fails: node 0 still prints the diagnosis ----
worker='[ "$RANK" = 1 ] && exec '"$recorder"' fails; echo $$ >"$WORK/pid.$RANK"; exit 0'
rm -f "$WORK"/pid.*
start_node node0 --nnodes=2 --node_rank=0 --master_port=29572 --log_dir "$WORK/logs2" /bin/sh -c "$worker"
node0=$NODE_PID
FAIL_ON=$WORK/go.3 start_node node1 --nnodes=2 --node_rank=1 --master_port=29572 /bin/sh -c "$worker"
node1=$NODE_PID
# Rank 1 fails once node 0's agent has reaped its worker (its pid is gone): an event, not a delay.
wait_reaped "$WORK/pid.0" 30
touch "$WORK/go.3"
wait_node "$node0" 40
expect_eq "$NODE_STATUS" 3 "node 0's exit code"
wait_node "$node1" 40
expect_eq "$NODE_STATUS" 3 "node 1's exit code"
expect_in_file "$WORK/node0.err" "on node 1 exited with code 3), from the ranks' flight recorders:" \
  "node 0's diagnosis after its own workers succeeded"
expect_in_file "$WORK/node0.err" "rank 1 failed in all_gather #6 (float32[1024]) (then exited with code 3)" \
  "node 1's failed rank, in node 0's diagnosis"
expect_in_file "$WORK/node0.err" "no dump from rank 0 (had finished (exited with code 0)): node 0's workers had all succeeded" \
  "node 0's own rank, done"
ls "$WORK"/logs2/*/attempt_0/diagnosis.json >/dev/null 2>&1 || fail "no diagnosis.json in node 0's log dir"
expect_no_leftovers
echo PASS
