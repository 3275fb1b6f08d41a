# A restarted job gets a new store (Note [Store keeper] in launcher/workers/store_keeper_plan.h): with
# --max_restarts=1, attempt 0's ranks write keys into the workers' store, outside PyTorch's
# per-attempt prefix and under /worker/attempt_0, train a few steps, and the last rank fails; attempt
# 1's ranks see none of those keys and train. A C++ job on cpprun's library
# (tests/launcher/store_keys_probe.cpp), then a torch.distributed (env://) job, each at a fixed
# --master_port (the same port both attempts) and, for the C++ one, also on a port the kernel picks.
# In a private network namespace (tests/run_isolated.sh).
. "$(dirname "$0")/common.sh"
probe=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_store_keys_probe}
require_private_netns

# The job's console: attempt 0 trained and failed, attempt 1 saw no key of attempt 0 and trained.
expect_fresh_store() {  # what ranks
  local rank
  expect_eq "$status" 0 "$1: exit code"
  expect_in_file "$WORK/err" "restarting all workers (restart 1 of --max_restarts=1, TORCHELASTIC_RESTART_COUNT=1)" \
    "$1: the restart"
  for ((rank = 0; rank < $2; rank++)); do
    grep -qF "[rank$rank]: attempt 0 trained: loss" "$WORK/out" || fail "$1: rank $rank did not train in attempt 0"
    expect_in_file "$WORK/out" "[rank$rank]: attempt 1: none of attempt 0's keys" "$1: rank $rank's store in attempt 1"
    grep -F "[rank$rank]: attempt 1 trained: loss" "$WORK/out" | grep -qF "(falling)" ||
      fail "$1: rank $rank did not train in attempt 1"
  done
  grep -q "sees attempt 0's key" "$WORK/out" && fail "$1: a rank of attempt 1 saw attempt 0's keys"
  expect_no_leftovers
}

cpprun --nproc_per_node=2 --max_restarts=1 --restart_backoff=0 --master_port=29557 "$probe"
status=$?
expect_fresh_store "cpprun's library, --master_port=29557" 2
cpprun --nproc_per_node=2 --max_restarts=1 --restart_backoff=0 "$probe"
status=$?
expect_fresh_store "cpprun's library, a port the kernel picks" 2

find_torch_python_or_skip
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
cat >"$WORK/store_keys.py" <<'PY'
import datetime, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# A client of the store itself, below env://'s /worker/attempt_N prefix.
raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
keys = lambda r: [f"probe/unprefixed/{r}", f"/worker/attempt_0/probe/{r}"]
if attempt == 0:
    for key in keys(rank):
        raw.set(key, "0")
else:
    seen = [key for r in range(world) for key in keys(r) if raw.check([key])]
    print(f"attempt {attempt}: sees attempt 0's key {seen}" if seen else f"attempt {attempt}: none of attempt 0's keys",
          flush=True)
dist.barrier()  # every rank's keys are in before any rank fails
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(rank + 1))
y = x.sum(1, keepdim=True)
losses = []
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
falling = "(falling)" if losses[-1] < losses[0] else "(not falling)"
print(f"attempt {attempt} trained: loss {losses[0]:.4f} -> {losses[-1]:.4f} {falling}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(3 if attempt == 0 and rank == world - 1 else 0)  # os._exit: see python_scripts.sh
PY
PYTHON_EXEC=$python VIRTUAL_ENV= cpprun --nproc_per_node=2 --max_restarts=1 --restart_backoff=0 --master_port=29558 \
  "$WORK/store_keys.py"
status=$?
expect_fresh_store "torch.distributed, --master_port=29558" 2
echo PASS
