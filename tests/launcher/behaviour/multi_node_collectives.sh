# Multi-node (2): the library's multi-rank collectives test (tests/dist/test_collectives.cpp) on two
# cpprun agents as nodes with 2 and 1 workers: each rank inits its process group from the
# environment through the c10d store node 0's agent hosts (its store keeper, on the MASTER_PORT node 0
# bound; TORCHELASTIC_USE_AGENT_STORE=True), and Gloo's all-reduce and friends cross both agents. Then, when python3
# has torch, the same with torch.distributed workers, whose env:// reads the same variables.
. "$(dirname "$0")/common.sh"
require_private_netns
collectives=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_dist_collectives}

start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_port=29520 "$collectives"
node1=$NODE_PID
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29520 "$collectives"
node0=$NODE_PID
wait_node "$node0" 80
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 80
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.out" "[rank0]: All tests passed" "rank 0's result"
expect_in_file "$WORK/node0.out" "[rank1]: All tests passed" "rank 1's result"
expect_in_file "$WORK/node1.out" "[rank2]: All tests passed" "rank 2's result"
expect_no_leftovers

find_torch_python_or_skip
cat >"$WORK/worker.py" <<'PY'
import datetime, os, sys, torch, torch.distributed as dist
# env://: RANK, WORLD_SIZE, MASTER_*; TORCHELASTIC_USE_AGENT_STORE=True: every rank a client of the agent's store.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"world {dist.get_world_size()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # PyTorch 2.15's Gloo threads may abort at finalization (see python_scripts.sh)
PY
export GLOO_SOCKET_IFNAME=lo
start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_port=29521 "$python" "$WORK/worker.py"
node1=$NODE_PID
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29521 "$python" "$WORK/worker.py"
node0=$NODE_PID
wait_node "$node0" 60
expect_eq "$NODE_STATUS" 0 "node 0's exit code (torch.distributed workers)"
wait_node "$node1" 60
expect_eq "$NODE_STATUS" 0 "node 1's exit code (torch.distributed workers)"
for rank in 0 1; do expect_in_file "$WORK/node0.out" "[rank$rank]: world 3 sum 6" "python rank $rank"; done
expect_in_file "$WORK/node1.out" "[rank2]: world 3 sum 6" "python rank 2"
expect_no_leftovers
echo PASS
