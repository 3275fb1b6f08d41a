# Restarts back off across nodes too: the agent hosting the rendezvous (node 0; with c10d the host
# of the endpoint) waits --restart_backoff before it starts every node's next attempt, the wait
# doubling with each quick failure; a signal to it during the wait ends the job on every node at
# once. Static and c10d rendezvous. Timings are lower bounds only.
. "$(dirname "$0")/common.sh"
require_private_netns

# Rank 1 (on the second node) fails at once; rank 0 waits to be stopped.
worker='date +%s%3N >>"$WORK/starts.$RANK"; [ "$RANK" = 1 ] && exit 3; exec sleep 60'

expect_gaps() {  # what: rank 1's attempts started at least 500 and then 1000 ms apart
  set -- $(cat "$WORK/starts.1")
  [ "$#" = 3 ] || fail "$what: rank 1 started $# times, expected 3"
  [ $(($2 - $1)) -ge 500 ] || fail "$what: restart 1 came $(($2 - $1)) ms after the failure, before the 0.5 s wait"
  [ $(($3 - $2)) -ge 1000 ] || fail "$what: restart 2 came $(($3 - $2)) ms after the failure, before the 1 s wait"
}

# (1) Static: two restarts, 0.5 s and 1 s apart.
what=static
start_node node0 --nnodes=2 --node_rank=0 --master_port=29570 --max_restarts=2 --restart_backoff=0.5:20 \
  /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 --nnodes=2 --node_rank=1 --master_port=29570 --max_restarts=2 --restart_backoff=0.5:20 \
  /bin/sh -c "$worker"
node1=$NODE_PID
wait_node "$node0" 60
expect_eq "$NODE_STATUS" 3 "static: node 0's exit code"
wait_node "$node1" 60
expect_eq "$NODE_STATUS" 3 "static: node 1's exit code"
expect_in_file "$WORK/node0.err" "restarting in 0.5 s (restart 1 of --max_restarts=2; --restart_backoff=0.5:20" "$what"
expect_in_file "$WORK/node0.err" "restarting in 1 s (restart 2 of --max_restarts=2" "$what"
expect_gaps
expect_no_leftovers

# (2) c10d: the same, decided by the agent hosting the endpoint.
what=c10d
rm -f "$WORK"/starts.*
c10d=(--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29620 --rdzv_id=backoff --nnodes=2 --max_restarts=2
      --restart_backoff=0.5:20)
start_node nodeA "${c10d[@]}" /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A is node 0: rank 0
start_node nodeB "${c10d[@]}" /bin/sh -c "$worker"
b=$NODE_PID
wait_node "$a" 60
expect_eq "$NODE_STATUS" 3 "c10d: the host's exit code"
wait_node "$b" 60
expect_eq "$NODE_STATUS" 3 "c10d: the member's exit code"
expect_in_file "$WORK/nodeA.err" "restarting in 0.5 s (restart 1 of --max_restarts=2; --restart_backoff=0.5:20" "$what"
expect_in_file "$WORK/nodeA.err" "restarting in 1 s (restart 2 of --max_restarts=2" "$what"
expect_gaps
expect_no_leftovers

# (3) SIGTERM to the host during a 60 s wait: both agents exit 143 at once, no second attempt.
for backend in static c10d; do
  rm -f "$WORK"/starts.*
  if [ "$backend" = static ]; then
    start_node node0 --nnodes=2 --node_rank=0 --master_port=29571 --max_restarts=1 --restart_backoff=60 \
      /bin/sh -c "$worker"
    host=$NODE_PID
    start_node node1 --nnodes=2 --node_rank=1 --master_port=29571 --max_restarts=1 --restart_backoff=60 \
      /bin/sh -c "$worker"
    member=$NODE_PID
    host_err=$WORK/node0.err
  else
    c10d=(--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29621 --rdzv_id=backoff --nnodes=2 --max_restarts=1
          --restart_backoff=60)
    start_node nodeA "${c10d[@]}" /bin/sh -c "$worker"
    host=$NODE_PID
    wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"
    start_node nodeB "${c10d[@]}" /bin/sh -c "$worker"
    member=$NODE_PID
    host_err=$WORK/nodeA.err
  fi
  wait_for_text 30 "$host_err" "restarting in 60 s (restart 1 of --max_restarts=1"
  kill -TERM "$host"
  wait_node "$host" 15  # far below the 60 s wait
  expect_eq "$NODE_STATUS" 143 "$backend: the host's exit code after SIGTERM during the wait"
  wait_node "$member" 15
  expect_eq "$NODE_STATUS" 143 "$backend: the member's exit code after SIGTERM to the host during the wait"
  # (Rank 0 may be stopped before it writes its line: count rank 1's.)
  expect_eq "$(wc -l <"$WORK/starts.1")" 1 "$backend: attempts rank 1 started"
  expect_no_leftovers
done
echo PASS
