# c10d rendezvous (--rdzv_backend=c10d --nnodes=MIN:MAX) with agents on the loopback: the first agent
# to listen at the endpoint hosts it, nodes are numbered in the order they join, nodes may run
# different --nproc_per_node, and the workers get torchrun's c10d environment (MASTER_PORT picked by
# the host, worker rank 0 hosting the store). The round starts after the last call with MIN nodes,
# or at once with MAX.
. "$(dirname "$0")/common.sh"
require_private_netns

elastic() {  # NAME PORT NPROC ARGS...: one agent of job "job7"
  local name=$1 port=$2 nproc=$3
  shift 3
  start_node "$name" --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:"$port" --rdzv_id=job7 --nproc_per_node="$nproc" \
    --max_restarts=2 "$@"
}

# (1) --nnodes=2:3 and two agents: after last_call_timeout=1 the round starts with two. Join order
# decides the numbering: node a (2 workers) first, then node b (1 worker).
# Each worker marks when it started (started.RANK): the round's start, for the time bounds.
worker='date +%s%3N >"$WORK/started.$RANK"; env >"$WORK/env.$RANK"'
elastic nodeA 29600 2 --nnodes=2:3 --rdzv_conf last_call_timeout=1 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
b_launched=$(now_ms)  # B joins after this, and MIN with it: the last call cannot start earlier
elastic nodeB 29600 1 --nnodes=2:3 --rdzv_conf last_call_timeout=1 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "starting round 0 in 1 s unless more join"
last_call=$(now_ms)  # seen a little after the host said it
wait_node "$a" 20
expect_eq "$NODE_STATUS" 0 "node a's exit code"
wait_node "$b" 20
expect_eq "$NODE_STATUS" 0 "node b's exit code"
ended=$(now_ms)
# The round started (its first worker) at least 1 s after B was launched; the whole was bounded
# from the last call on, not from the agents' start-up.
first_worker=$(sort -n "$WORK"/started.* | head -1)
latest_mark "the workers of round 0" "$WORK"/started.{0,1,2}
elapsed=$((first_worker - b_launched))
[ "$elapsed" -ge 1000 ] || fail "the round started $elapsed ms after B was launched, before last_call_timeout=1 s"
elapsed=$((ended - last_call))
[ "$elapsed" -lt 10000 ] || fail "the round took $elapsed ms to start and finish after the last call"
expect_in_file "$WORK/nodeA.err" "this agent hosts the c10d rendezvous at 127.0.0.1:29600 (--rdzv_id=job7, --nnodes=2:3)" \
  "a's host line"
expect_in_file "$WORK/nodeA.err" "starting round 0 in 1 s unless more join (--rdzv_conf last_call_timeout)" "a's last call"
expect_in_file "$WORK/nodeA.err" "rendezvous round 0 complete at 127.0.0.1:29600: 2 nodes of --nnodes=2:3, 3 workers (node 0: ranks 0-1, node 1 (127.0.0.1:" \
  "a's round line"
expect_in_file "$WORK/nodeB.err" "joined the c10d rendezvous at 127.0.0.1:29600 (--rdzv_id=job7): round 0, node 1 of 2, rank 2 of WORLD_SIZE=3" \
  "b's join line"
port=$(sed -n 's/.*MASTER_PORT=\([0-9]*\)$/\1/p' "$WORK/nodeA.err")
[ -n "$port" ] && [ "$port" != 29600 ] || fail "the workers' MASTER_PORT ('$port') should be a free port the host picked"
# Node b's workers reach the store through their agent's loopback port (on one host, not the host's).
tunnel_port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.2")
[ -n "$tunnel_port" ] && [ "$tunnel_port" != "$port" ] || fail "node b's MASTER_PORT ('$tunnel_port') is not its agent's own"
# rank: LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK
expected=("0 2 0" "1 2 0" "0 1 1")
for rank in 0 1 2; do
  set -- ${expected[$rank]}
  rank_port=$port
  [ "$rank" = 2 ] && rank_port=$tunnel_port
  for var in "RANK=$rank" "LOCAL_RANK=$1" WORLD_SIZE=3 "LOCAL_WORLD_SIZE=$2" "GROUP_RANK=$3" GROUP_WORLD_SIZE=2 \
             "ROLE_RANK=$rank" ROLE_WORLD_SIZE=3 ROLE_NAME=default MASTER_ADDR=127.0.0.1 "MASTER_PORT=$rank_port" \
             TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=2 \
             TORCHELASTIC_RUN_ID=job7; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "rank $rank: $var missing; got: $(grep -E '^(RANK|LOCAL_|GROUP_|ROLE_|WORLD_SIZE|MASTER_|TORCHELASTIC_)' "$WORK/env.$rank" | tr '\n' ' ')"
  done
done
expect_no_leftovers

# (2) Three agents of --nnodes=2:3 (3, 1 and 2 workers): MAX is there, so the round starts at once,
# not after last_call_timeout=30.
rm -f "$WORK"/env.* "$WORK"/started.*
elastic nodeA 29601 3 --nnodes=2:3 --rdzv_conf last_call_timeout=30 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
elastic nodeB 29601 1 --nnodes=2:3 --rdzv_conf last_call_timeout=30 /bin/sh -c "$worker"
b=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "2 nodes (--nnodes=2:3) at"  # B is node 1
c_launched=$(now_ms)  # from here, not from A's start-up
elastic nodeC 29601 2 --nnodes=2:3 --rdzv_conf last_call_timeout=30 /bin/sh -c "$worker"
c=$NODE_PID
for node in a b c; do
  eval "pid=\$$node"
  wait_node "$pid" 20
  expect_eq "$NODE_STATUS" 0 "node $node's exit code (three nodes)"
done
latest_mark "the workers of the three nodes" "$WORK"/started.{0,1,2,3,4,5}
elapsed=$((MARK - c_launched))
[ "$elapsed" -lt 10000 ] || fail "the round started $elapsed ms after C was launched: it should start when MAX joined, not after last_call_timeout=30"
expect_in_file "$WORK/nodeA.err" "3 nodes of --nnodes=2:3, 6 workers (node 0: ranks 0-2, node 1 (127.0.0.1:" "a's round line (three nodes)"
# rank: GROUP_RANK LOCAL_RANK LOCAL_WORLD_SIZE
expected=("0 0 3" "0 1 3" "0 2 3" "1 0 1" "2 0 2" "2 1 2")
for rank in 0 1 2 3 4 5; do
  set -- ${expected[$rank]}
  for var in "RANK=$rank" WORLD_SIZE=6 "GROUP_RANK=$1" GROUP_WORLD_SIZE=3 "LOCAL_RANK=$2" "LOCAL_WORLD_SIZE=$3"; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "three nodes, rank $rank: $var missing"
  done
done
expect_no_leftovers

# (3) --nnodes=1:2 and one agent: MIN is there at once; the round starts after the last call alone.
rm -f "$WORK"/env.*
elastic nodeA 29602 1 --nnodes=1:2 --rdzv_conf last_call_timeout=0.2 /bin/sh -c "$worker"
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 0 "a lone node of --nnodes=1:2"
grep -qxF GROUP_WORLD_SIZE=1 "$WORK/env.0" || fail "a lone node: GROUP_WORLD_SIZE=1 missing"

# (4) --local_addr, as torchrun's: with --no_job_secret (the store reached directly, not through the
# agents) the hosting agent's is every worker's MASTER_ADDR; a member's is not.
rm -f "$WORK"/env.*
CPPRUN_JOB_SECRET= elastic nodeA 29603 1 --nnodes=2 --local_addr=127.0.0.3 --no_job_secret /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"
CPPRUN_JOB_SECRET= elastic nodeB 29603 1 --nnodes=2 --local-addr=127.0.0.4 --no_job_secret /bin/sh -c "$worker"
b=$NODE_PID
wait_node "$a" 20
expect_eq "$NODE_STATUS" 0 "--local_addr: node a's exit code"
wait_node "$b" 20
expect_eq "$NODE_STATUS" 0 "--local_addr: node b's exit code"
for rank in 0 1; do
  grep -qxF MASTER_ADDR=127.0.0.3 "$WORK/env.$rank" || fail "--local_addr: rank $rank's MASTER_ADDR is not the host's"
done
[ "$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")" = "$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.1")" ] ||
  fail "--no_job_secret: the nodes' MASTER_PORT differ; the store should be reached directly at the host's"
expect_no_leftovers
echo PASS
