# Multi-node (1): two cpprun agents on the loopback as nodes 0 and 1, running 2 and 1 workers. Every
# worker gets torchrun's numbering across the nodes (a node's ranks contiguous, in node-rank order,
# whichever node starts first), worker rank 0 hosts the workers' store on one port node 0 picked (not
# --master_port, where the agents meet), node 1's workers reach it through their agent's own loopback
# port (the store tunnel: on one host node 0's port is rank 0's), and a node whose workers are done
# waits for the other (exit barrier).
. "$(dirname "$0")/common.sh"
require_private_netns

# Node 0's workers wait for $WORK/release; node 1's finish at once.
worker='env >"$WORK/env.$RANK"; echo $$ >"$WORK/pid.$RANK"; [ "$GROUP_RANK" = 1 ] || while [ ! -e "$WORK/release" ]; do sleep 0.05; done'
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29510 --rdzv_id=job7 /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 --nnodes=2 --node-rank=1 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29510 \
  --rdzv_id=job7 /bin/sh -c "$worker"
node1=$NODE_PID
wait_for_files 30 "$WORK/env.0" "$WORK/env.1" "$WORK/env.2"
# Once node 1's agent has reaped its worker it would exit within milliseconds without the barrier:
# the 0.5 s are that grace, counted from the event, not a guess at when the worker ends.
wait_reaped "$WORK/pid.2" 30
sleep 0.5
alive "$node1" || fail "node 1's cpprun exited while node 0's workers were still running (no exit barrier)"
touch "$WORK/release"
wait_node "$node0" 20
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 20
expect_eq "$NODE_STATUS" 0 "node 1's exit code"

# rank: LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK
expected=("0 2 0" "1 2 0" "0 1 1")
master_port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")
[ -n "$master_port" ] && [ "$master_port" != 29510 ] || fail "the workers' MASTER_PORT is '$master_port', not a port of their own"
tunnel_port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.2")
[ -n "$tunnel_port" ] && [ "$tunnel_port" != 29510 ] && [ "$tunnel_port" != "$master_port" ] ||
  fail "node 1's MASTER_PORT is '$tunnel_port', not its agent's own port (node 0's is $master_port)"
for rank in 0 1 2; do
  set -- ${expected[$rank]}
  port=$master_port
  [ "$rank" = 2 ] && port=$tunnel_port
  for var in "RANK=$rank" "LOCAL_RANK=$1" WORLD_SIZE=3 "LOCAL_WORLD_SIZE=$2" "GROUP_RANK=$3" GROUP_WORLD_SIZE=2 \
             "ROLE_RANK=$rank" ROLE_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 "MASTER_PORT=$port" \
             TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_RUN_ID=job7; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "rank $rank: $var missing; got: $(grep -E '^(RANK|LOCAL_|GROUP_|WORLD_SIZE)' "$WORK/env.$rank" | tr '\n' ' ')"
  done
done
expect_in_file "$WORK/node0.err" "all 2 nodes joined at 127.0.0.1:29510; 3 workers (node 0: ranks 0-1, node 1: rank 2)" \
  "node 0's rendezvous line"

# Node ranks, not arrival order, set the numbering: node 1 (3 workers) starts first.
rm -f "$WORK"/env.*
worker='env >"$WORK/env.$RANK"'
start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=3 --master_port=29511 /bin/sh -c "$worker"
node1=$NODE_PID
# Node 1 is seen trying to reach node 0, and keeps trying: then node 0 starts.
wait_for_connect_attempt 29511 15
wait_for_text 10 "$WORK/node1.err" "closed this node's connection before the handshake completed; trying again"
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_port=29511 /bin/sh -c "$worker"
node0=$NODE_PID
wait_node "$node0" 30
expect_eq "$NODE_STATUS" 0 "node 0's exit code (second job)"
wait_node "$node1" 30
expect_eq "$NODE_STATUS" 0 "node 1's exit code (second job)"
for rank in 0 1 2 3; do
  group=$((rank == 0 ? 0 : 1))
  local_rank=$((rank == 0 ? 0 : rank - 1))
  for var in "RANK=$rank" "GROUP_RANK=$group" "LOCAL_RANK=$local_rank" WORLD_SIZE=4; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "second job, rank $rank: $var missing"
  done
done
expect_no_leftovers
echo PASS
