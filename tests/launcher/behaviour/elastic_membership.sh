# c10d rendezvous: nodes that come and go. A node joining a running job with room restarts every
# node's workers with it; a lost node makes the others go on without it while at least MIN remain,
# and ends the job below MIN; the host's loss ends the job on every node; a node arriving at MAX
# waits (and exits 0 if the job finishes without it, or takes a lost node's place). Membership
# changes do not count against --max_restarts (TORCHELASTIC_RESTART_COUNT stays 0), as with
# torchrun; worker failures do.
. "$(dirname "$0")/common.sh"
require_private_netns

elastic() {  # NAME PORT ARGS...: one agent of job "job3", one worker
  local name=$1 port=$2
  shift 2
  start_node "$name" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:"$port" --rdzv_id=job3 "$@"
}

# Workers write their environment to env.wsWORLD_SIZE.RANK; those of the round that should be
# ended ($hold_ws) wait to be stopped, the others finish at once.
worker='env >"$WORK/env.ws$WORLD_SIZE.$RANK"; echo $$ >"$WORK/pid.ws$WORLD_SIZE.$RANK"; [ "$WORLD_SIZE" = "$HOLD_WS" ] && exec sleep 60; exit 0'

# (1) A late joiner. Round 0 runs with two of --nnodes=2:3; a third agent arrives, every node's
# workers are stopped, and round 1 runs with three, the newcomer as node 2.
export HOLD_WS=2
elastic nodeA 29610 --nnodes=2:3 --max_restarts=0 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29610 --nnodes=2:3 --max_restarts=0 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_files 20 "$WORK/env.ws2.0" "$WORK/env.ws2.1"
elastic nodeC 29610 --nnodes=2:3 --max_restarts=0 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
c=$NODE_PID
for node in a b c; do
  eval "pid=\$$node"
  wait_node "$pid" 30
  expect_eq "$NODE_STATUS" 0 "node $node's exit code after the late join"
done
for rank in 0 1 2; do
  for var in "RANK=$rank" WORLD_SIZE=3 "GROUP_RANK=$rank" GROUP_WORLD_SIZE=3 TORCHELASTIC_RESTART_COUNT=0 \
             TORCHELASTIC_MAX_RESTARTS=0; do
    grep -qxF "$var" "$WORK/env.ws3.$rank" || fail "late join, round 1, rank $rank: $var missing"
  done
done
expect_in_file "$WORK/nodeA.err" "joined the running job; ending round 0 to take it in" "a's note of the newcomer"
expect_in_file "$WORK/nodeA.err" "rendezvous round 1 complete at 127.0.0.1:29610: 3 nodes of --nnodes=2:3, 3 workers" \
  "a's round 1 line"
expect_in_file "$WORK/nodeB.err" "stopping this node's workers: a new node (the agent at 127.0.0.1:" "b's reason"
expect_in_file "$WORK/nodeB.err" "rendezvous round 1: the nodes changed; restarting this node's workers as node 1 of 3 (WORLD_SIZE=3; a membership change, not counted against --max_restarts: TORCHELASTIC_RESTART_COUNT stays 0)" \
  "b's restart line"
expect_in_file "$WORK/nodeC.err" "is running round 0 on 2 nodes; this node joins it now" "c's queued line"
expect_in_file "$WORK/nodeC.err" "joined the c10d rendezvous at 127.0.0.1:29610 (--rdzv_id=job3): round 1, node 2 of 3" \
  "c's join line"
for rank in 0 1; do
  pid=$(cat "$WORK/pid.ws2.$rank")
  alive "$pid" && fail "round 0's rank $rank (pid $pid) outlived its round"
done
expect_no_leftovers

# (2) Three of --nnodes=2:3 (all there within the last call); node 1's agent is killed. Nodes 0 and 2
# meet again as nodes 0 and 1 (round 1, WORLD_SIZE=2) and finish.
rm -f "$WORK"/env.* "$WORK"/pid.*
export HOLD_WS=3
elastic nodeA 29611 --nnodes=2:3 --rdzv_conf last_call_timeout=2 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29611 --nnodes=2:3 --rdzv_conf last_call_timeout=2 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "2 nodes (--nnodes=2:3) at"  # B is node 1; C comes within the last call
elastic nodeC 29611 --nnodes=2:3 --rdzv_conf last_call_timeout=2 /bin/sh -c "$worker"
c=$NODE_PID
wait_for_files 20 "$WORK/pid.ws3.0" "$WORK/pid.ws3.1" "$WORK/pid.ws3.2"
grep -qxF GROUP_RANK=1 "$WORK/env.ws3.1" || fail "the second agent should be node 1"
victim_worker=$(cat "$WORK/pid.ws3.1")
kill -KILL "$b"
wait "$b" 2>/dev/null
for node in a c; do
  eval "pid=\$$node"
  wait_node "$pid" 30
  expect_eq "$NODE_STATUS" 0 "node $node's exit code after node 1 was lost"
done
for rank in 0 1; do
  for var in "RANK=$rank" WORLD_SIZE=2 "GROUP_RANK=$rank" GROUP_WORLD_SIZE=2 TORCHELASTIC_RESTART_COUNT=0; do
    grep -qxF "$var" "$WORK/env.ws2.$rank" || fail "after the loss, rank $rank: $var missing"
  done
done
expect_in_file "$WORK/nodeC.err" "stopping this node's workers: the agent of node 1 (127.0.0.1:" "c's reason"
expect_in_file "$WORK/nodeC.err" "is gone: it was killed, or its host or network went down" "c's reason"
expect_in_file "$WORK/nodeC.err" "restarting this node's workers as node 1 of 2 (WORLD_SIZE=2" "c's restart line"
expect_in_file "$WORK/nodeA.err" "rendezvous round 1 complete at 127.0.0.1:29611: 2 nodes of --nnodes=2:3" "a's round 1"
alive "$victim_worker" && fail "the killed agent's worker (pid $victim_worker) outlived it"
rm -rf "$TMPDIR"/cpprun-*  # the killed agent could not remove its temp dir
expect_no_leftovers_within 5  # nor had its guardian necessarily finished sweeping

# (3) Two of --nnodes=2:3 and one is killed: one node is below MIN, the job ends with a clear error.
rm -f "$WORK"/env.* "$WORK"/pid.*
export HOLD_WS=2
elastic nodeA 29612 --nnodes=2:3 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29612 --nnodes=2:3 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_files 20 "$WORK/pid.ws2.0" "$WORK/pid.ws2.1"
started=$(now_ms)
kill -KILL "$b"
wait "$b" 2>/dev/null
wait_node "$a" 20
expect_eq "$NODE_STATUS" 1 "the survivor's exit code below MIN"
[ $(($(now_ms) - started)) -lt 10000 ] || fail "the survivor took $(($(now_ms) - started)) ms to give up"
expect_in_file "$WORK/nodeA.err" "exiting with code 1: the agent of node 1 (127.0.0.1:" "a's last line"
expect_in_file "$WORK/nodeA.err" "only 1 node remains, fewer than the 2 that --nnodes=2:3 needs, so the job cannot go on" \
  "a's last line"
rm -rf "$TMPDIR"/cpprun-*
expect_no_leftovers_within 5  # the killed agent's guardian may still be sweeping

# (4) The host's agent is killed: its members cannot go on (torchrun's c10d store dies with it too).
rm -f "$WORK"/env.* "$WORK"/pid.*
elastic nodeA 29613 --nnodes=2:3 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29613 --nnodes=2:3 --rdzv_conf last_call_timeout=0.3 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_files 20 "$WORK/pid.ws2.0" "$WORK/pid.ws2.1"
kill -KILL "$a"
wait "$a" 2>/dev/null
wait_node "$b" 20
expect_eq "$NODE_STATUS" 1 "the member's exit code after the host was lost"
expect_in_file "$WORK/nodeB.err" "the agent hosting the c10d rendezvous at 127.0.0.1:29613 (127.0.0.1:29613) is gone: it was killed, or its host or network went down; the job cannot go on without the agent that hosts its c10d rendezvous" \
  "b's message"
rm -rf "$TMPDIR"/cpprun-*
expect_no_leftovers_within 5  # the killed agent's guardian may still be sweeping

# (5) A node that comes while the job runs at MAX (--nnodes=1:2) waits for a next round; the job
# finishes without one, and the late node exits 0, having run nothing.
rm -f "$WORK"/env.* "$WORK"/pid.*
worker='echo $$ >"$WORK/pid.$GROUP_RANK"; while [ ! -e "$WORK/release" ]; do sleep 0.05; done'
elastic nodeA 29614 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29614 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_files 20 "$WORK/pid.0" "$WORK/pid.1"
elastic nodeC 29614 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
c=$NODE_PID
deadline=$((SECONDS + 10))
until grep -q "this node joins it in its next round" "$WORK/nodeC.err" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the third node was not queued"
  sleep 0.05
done
expect_in_file "$WORK/nodeA.err" "it waits for a next round (the job runs at its maximum of --nnodes=1:2)" "a's note"
touch "$WORK/release"
for node in a b c; do
  eval "pid=\$$node"
  wait_node "$pid" 20
  expect_eq "$NODE_STATUS" 0 "node $node's exit code (job at MAX)"
done
expect_in_file "$WORK/nodeC.err" "the job at 127.0.0.1:29614 (--rdzv_id=job3) finished before this node got into a round; nothing ran here" \
  "c's last line"
[ -e "$WORK/pid.2" ] && fail "the queued node ran a worker"
expect_no_leftovers

# (6) A worker failure is a restart, counted against --max_restarts (TORCHELASTIC_RESTART_COUNT=1).
rm -f "$WORK"/env.* "$WORK"/pid.*
worker='env >"$WORK/env.rc$TORCHELASTIC_RESTART_COUNT.$RANK"; [ "$TORCHELASTIC_RESTART_COUNT$RANK" = 01 ] && exit 5; [ "$RANK" = 0 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exec sleep 60; exit 0'
elastic nodeA 29615 --nnodes=2 --max_restarts=1 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29615 --nnodes=2 --max_restarts=1 /bin/sh -c "$worker"
b=$NODE_PID
for node in a b; do
  eval "pid=\$$node"
  wait_node "$pid" 30
  expect_eq "$NODE_STATUS" 0 "node $node's exit code with one restart"
done
grep -qxF TORCHELASTIC_RESTART_COUNT=1 "$WORK/env.rc1.1" || fail "the restart should have TORCHELASTIC_RESTART_COUNT=1"
expect_in_file "$WORK/nodeA.err" "restarting the workers of all 2 nodes (restart 1 of --max_restarts=1, TORCHELASTIC_RESTART_COUNT=1)" \
  "a's restart line"
expect_no_leftovers

# (7) A node waiting while the job runs at MAX (--nnodes=1:2) takes the place of a lost one.
rm -f "$WORK"/env.* "$WORK"/pid.* "$WORK/release"
worker='echo $$ >"$WORK/pid.$GROUP_RANK"; while [ ! -e "$WORK/release" ]; do sleep 0.05; done'
elastic nodeA 29616 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"
elastic nodeB 29616 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_files 20 "$WORK/pid.0" "$WORK/pid.1"
elastic nodeC 29616 --nnodes=1:2 --rdzv_conf last_call_timeout=5 /bin/sh -c "$worker"
c=$NODE_PID
wait_for_text 10 "$WORK/nodeC.err" "this node joins it in its next round"
rm -f "$WORK"/pid.*
kill -KILL "$b"
wait "$b" 2>/dev/null
wait_for_text 20 "$WORK/nodeC.err" "joined the c10d rendezvous at 127.0.0.1:29616 (--rdzv_id=job3): round 1, node 1 of 2"
wait_for_files 20 "$WORK/pid.0" "$WORK/pid.1"
touch "$WORK/release"
for node in a c; do
  eval "pid=\$$node"
  wait_node "$pid" 20
  expect_eq "$NODE_STATUS" 0 "node $node's exit code (the waiting node replaced the lost one)"
done
expect_in_file "$WORK/nodeA.err" "rendezvous round 1 complete at 127.0.0.1:29616: 2 nodes of --nnodes=1:2" "a's round 1"
rm -rf "$TMPDIR"/cpprun-*
expect_no_leftovers_within 5  # the killed agent's guardian may still be sweeping
echo PASS
