# Multi-node (5): a node that never arrives. After --rdzv_conf timeout the agents fail with a
# message naming the missing node ranks, start no worker, and exit 1; no agent hangs.
. "$(dirname "$0")/common.sh"
require_private_netns

worker='touch "$WORK/started.$RANK"'

# Three nodes, node 2 never comes. Node 0's join timeout starts before it listens: the upper
# bound is timed from when it was seen listening, not from the agents' start-up; the lower from
# its launch, before its clock started.
start_node node1 --nnodes=3 --node_rank=1 --master_port=29550 --rdzv_conf timeout=3 /bin/sh -c "$worker"
node1=$NODE_PID
launched=$(now_ms)
start_node node0 --nnodes=3 --node_rank=0 --master_port=29550 --rdzv_conf timeout=3 /bin/sh -c "$worker"
node0=$NODE_PID
wait_for_listener "$node0" 29550 10
listening=$(now_ms)
wait_node "$node0" 20
expect_eq "$NODE_STATUS" 1 "node 0's exit code"
ended=$(now_ms)
wait_node "$node1" 20
expect_eq "$NODE_STATUS" 1 "node 1's exit code"
elapsed=$((ended - launched))
[ "$elapsed" -ge 3000 ] || fail "node 0 gave up $elapsed ms after its launch, before timeout=3"
elapsed=$(($(now_ms) - listening))
[ "$elapsed" -lt 15000 ] || fail "took $elapsed ms to give up after node 0 listened"
for node in 0 1; do
  expect_in_file "$WORK/node$node.err" "rendezvous timed out after 3 s (--rdzv_conf timeout): node rank 2 of --nnodes=3 never arrived at 127.0.0.1:29550" \
    "node $node's message"
done
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"

# Node 0 never comes: node 1 says so.
start_node node1 --nnodes=2 --node_rank=1 --master_port=29551 --rdzv_conf timeout=2 /bin/sh -c "$worker"
node1=$NODE_PID
wait_node "$node1" 15
expect_eq "$NODE_STATUS" 1 "lonely node 1's exit code"
expect_in_file "$WORK/node1.err" "rendezvous timed out after 2 s (--rdzv_conf timeout): node rank 0 never arrived: nothing answered at 127.0.0.1:29551" \
  "lonely node 1's message"
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"
expect_no_leftovers
echo PASS
