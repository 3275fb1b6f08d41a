# c10d rendezvous with real workers: the library's collectives test (tests/dist/test_collectives.cpp)
# across two agents (2 and 1 workers), each rank initialising its process group from torchrun's
# c10d environment (the hosting agent's store keeper serves the store at the MASTER_PORT it bound,
# TORCHELASTIC_USE_AGENT_STORE=True). Then a third agent joins: round 1 runs the test again with
# WORLD_SIZE=4 on a fresh store (a new keeper, a new MASTER_PORT). Then, when python3 has torch, torch.distributed workers.
. "$(dirname "$0")/common.sh"
require_private_netns
collectives=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_dist_collectives}

# Round 0 (WORLD_SIZE=3) passes the test and then waits to be stopped for the newcomer.
cat >"$WORK/twice.sh" <<SCRIPT
#!/bin/sh
"$collectives" || exit \$?
echo "collectives passed at WORLD_SIZE=\$WORLD_SIZE"
[ "\$WORLD_SIZE" = 3 ] && exec sleep 60
exit 0
SCRIPT
chmod +x "$WORK/twice.sh"
c10d="--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29630 --rdzv_id=coll --nnodes=2:3 --rdzv_conf last_call_timeout=0.5"
start_node nodeA $c10d --nproc_per_node=2 "$WORK/twice.sh"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
start_node nodeB $c10d --nproc_per_node=1 "$WORK/twice.sh"
b=$NODE_PID
deadline=$((SECONDS + 60))
until [ "$(cat "$WORK"/nodeA.out "$WORK"/nodeB.out | grep -c 'collectives passed at WORLD_SIZE=3')" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "round 0's collectives did not pass on all three ranks"
  alive "$a" && alive "$b" || fail "an agent exited during round 0"
  sleep 0.1
done
start_node nodeC $c10d --nproc_per_node=1 "$WORK/twice.sh"
c=$NODE_PID
for node in a b c; do
  eval "pid=\$$node"
  wait_node "$pid" 80
  expect_eq "$NODE_STATUS" 0 "node $node's exit code"
done
for rank in 0 1; do expect_in_file "$WORK/nodeA.out" "[rank$rank]: collectives passed at WORLD_SIZE=4" "rank $rank, round 1"; done
expect_in_file "$WORK/nodeB.out" "[rank2]: collectives passed at WORLD_SIZE=4" "rank 2, round 1"
expect_in_file "$WORK/nodeC.out" "[rank3]: collectives passed at WORLD_SIZE=4" "rank 3 (the newcomer), round 1"
expect_no_leftovers

find_torch_python_or_skip
cat >"$WORK/worker.py" <<'PY'
import datetime, os, sys, torch, torch.distributed as dist
# env://: RANK, WORLD_SIZE, MASTER_*; TORCHELASTIC_USE_AGENT_STORE=True: every rank a client of the agent's store.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"world {dist.get_world_size()} sum {t.item():g} agent store {os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # PyTorch 2.15's Gloo threads may abort at finalization (see python_scripts.sh)
PY
export GLOO_SOCKET_IFNAME=lo
c10d="--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29631 --rdzv_id=py --nnodes=1:2"
start_node nodeA $c10d --nproc_per_node=2 "$python" "$WORK/worker.py"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
start_node nodeB $c10d --nproc_per_node=1 "$python" "$WORK/worker.py"
b=$NODE_PID
wait_node "$a" 60
expect_eq "$NODE_STATUS" 0 "node a's exit code (torch.distributed workers)"
wait_node "$b" 60
expect_eq "$NODE_STATUS" 0 "node b's exit code (torch.distributed workers)"
for rank in 0 1; do expect_in_file "$WORK/nodeA.out" "[rank$rank]: world 3 sum 6 agent store True" "python rank $rank"; done
expect_in_file "$WORK/nodeB.out" "[rank2]: world 3 sum 6 agent store True" "python rank 2"
expect_no_leftovers
echo PASS
