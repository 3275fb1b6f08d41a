# Multi-node (4): SIGKILL one node's agent mid-run. Its workers die with it (PR_SET_PDEATHSIG), and
# the other node's agent notices at once (the link between the agents closes), stops its workers
# and exits non-zero. Both ways round: node 1's agent killed, then node 0's (the store's host).
. "$(dirname "$0")/common.sh"
require_private_netns

worker='echo $$ >"$WORK/pid.$RANK"; exec sleep 60'

# $1: the node whose agent is killed; $2: the port.
kill_agent_of() {
  local victim=$1 port=$2 survivor=$((1 - $1)) rank pid deadline started
  rm -f "$WORK"/pid.*
  start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port="$port" /bin/sh -c "$worker"
  local agent0=$NODE_PID
  start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_port="$port" /bin/sh -c "$worker"
  local agent1=$NODE_PID
  wait_for_files 30 "$WORK/pid.0" "$WORK/pid.1" "$WORK/pid.2"
  for rank in 0 1 2; do wait_for_exec "$WORK/pid.$rank" sleep 10; done  # past `echo`
  local victim_pid=$agent0 survivor_pid=$agent1
  [ "$victim" = 1 ] && { victim_pid=$agent1; survivor_pid=$agent0; }
  started=$(now_ms)
  kill -KILL "$victim_pid"
  wait "$victim_pid" 2>/dev/null
  wait_node "$survivor_pid" 15
  [ "$NODE_STATUS" != 0 ] || fail "node $survivor's cpprun exited 0 after node $victim's agent was killed"
  [ $(($(now_ms) - started)) -lt 10000 ] || fail "node $survivor's cpprun took $(($(now_ms) - started)) ms to exit"
  expect_in_file "$WORK/node$survivor.err" "the agent of node $victim" "node $survivor's message"
  expect_in_file "$WORK/node$survivor.err" "is gone: it was killed, or its host or network went down" \
    "node $survivor's message"
  deadline=$((SECONDS + 5))
  for rank in 0 1 2; do
    pid=$(cat "$WORK/pid.$rank")
    while alive "$pid"; do
      [ "$SECONDS" -lt "$deadline" ] || fail "rank $rank (pid $pid) outlived the job"
      sleep 0.05
    done
  done
  # SIGKILL gives the killed agent no chance to remove its temp dir.
  rm -rf "$TMPDIR"/cpprun-*
  expect_no_leftovers_within 5  # the killed agent's guardian may still be sweeping
}

kill_agent_of 1 29540
kill_agent_of 0 29541
echo PASS
