# A stranger opening connections to node 0's agent at --master_port as fast as it can (each held silent for 1 s)
# does not keep node 1, which holds the job secret, out: pending connections are bounded per source,
# so the stranger's evict only its own; node 1 joins and the job runs, three times over.
. "$(dirname "$0")/common.sh"
require_private_netns

trials=${CPPRUN_FLOOD_TRIALS:-3}
for trial in $(seq "$trials"); do
  port=$((29580 + trial))
  start_node node0 --nnodes=2 --node_rank=0 --master_port=$port --rdzv_conf timeout=30 \
    /bin/sh -c 'echo "worker $RANK done"'
  node0=$NODE_PID
  link_port=$port  # where node 0's agent takes the other agents' links
  wait_for_listener "$node0" "$link_port" 10
  # The stranger is another host: 127.0.0.2, on this namespace's loopback.
  python3 "$(dirname "$0")/stranger.py" storm 127.0.0.1 "$link_port" 15 127.0.0.2 >"$WORK/storm.out" 2>&1 &
  storm=$!
  trap 'kill "$storm" 2>/dev/null; cleanup' EXIT
  # Node 1 comes once the storm is at full strength (it holds each connection 1 s and has let the
  # first go), an event rather than a sleep.
  wait_for_text 20 "$WORK/storm.out" "full: holding"
  start_node node1 --nnodes=2 --node_rank=1 --master_port=$port --rdzv_conf timeout=30 \
    /bin/sh -c 'echo "worker $RANK done"'
  node1=$NODE_PID
  wait_node "$node1" 40
  status1=$NODE_STATUS
  wait_node "$node0" 40
  status0=$NODE_STATUS
  kill "$storm" 2>/dev/null
  wait "$storm" 2>/dev/null
  expect_eq "$status1" 0 "trial $trial: node 1's exit code under the flood"
  expect_eq "$status0" 0 "trial $trial: node 0's exit code under the flood"
  expect_in_file "$WORK/node1.out" "[rank1]: worker 1 done" "trial $trial: node 1's worker ran"
  expect_in_file "$WORK/node0.out" "[rank0]: worker 0 done" "trial $trial: node 0's worker ran"
done
expect_no_leftovers
echo PASS
