# torchrun's rules for Python: `cpprun train.py` runs `python -u train.py` (the active environment's
# $VIRTUAL_ENV/bin/python, else python3 first on PATH), `-m` runs a module, and either prints exactly
# the losses PyTorch's own torchrun prints for the same DDP script (CPU, Gloo, DistributedSampler
# with set_epoch): 4 ranks on one node, and 2 nodes of 2. cpprun names the interpreter, and a
# worker's Python traceback reaches the failure summary.
. "$(dirname "$0")/common.sh"
require_private_netns
find_torch_python_or_skip
unset VIRTUAL_ENV CONDA_PREFIX PYTHON_EXEC  # each case below names its interpreter's source

mkdir -p "$WORK/pkg" "$WORK/torchrun-tmp"
# torch's workers make a compile cache under $TMPDIR; keep it out of cpprun's temp dir, which
# expect_no_leftovers checks.
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
touch "$WORK/pkg/__init__.py"
cat >"$WORK/pkg/ddp_train.py" <<'PY'
import datetime, os, sys, torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(256, 8, generator=g), torch.randint(0, 4, (256,), generator=g))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if dist.get_rank() == 0:
            print(f"world {dist.get_world_size()} epoch {epoch} step {step} loss {mean.item() / dist.get_world_size():.6f}")
dist.destroy_process_group()
# PyTorch 2.15's Gloo threads sometimes abort a worker during interpreter finalization ("terminate
# called without an active exception", under torchrun as under cpprun; pytorch/pytorch#190489):
# leave without finalizing, the same under both launchers.
sys.stdout.flush()
os._exit(0)
PY
cp "$WORK/pkg/ddp_train.py" "$WORK/train.py"
cd "$WORK"
venv_path="$(dirname "$python"):$PATH"   # as an activated virtual environment
losses() { sed -n 's/^\(\[rank0\]: \)\{0,1\}\(world .* loss .*\)$/\2/p' "$1"; }
torchrun() {  # its own TMPDIR: it leaves a torchelastic_* dir behind there
  TMPDIR=$WORK/torchrun-tmp timeout 120 "$python" -m torch.distributed.run --standalone "$@" >"$WORK/torchrun.out" 2>"$WORK/torchrun.err" ||
    { cat "$WORK/torchrun.err" >&2; fail "torchrun $* failed"; }
}

# The reference: PyTorch's own torchrun.
torchrun --nproc_per_node=4 train.py
losses "$WORK/torchrun.out" >"$WORK/reference"
expect_eq "$(wc -l <"$WORK/reference")" 8 "torchrun's loss lines (2 epochs x 4 steps)"

# cpprun train.py, the interpreter from PATH.
PATH=$venv_path cpprun --standalone --nproc_per_node=4 train.py
expect_eq "$?" 0 "cpprun train.py's exit code"
losses "$WORK/out" >"$WORK/cpprun.losses"
diff "$WORK/reference" "$WORK/cpprun.losses" >&2 || fail "cpprun train.py printed other losses than torchrun"

# An active virtual environment's python (here one that runs $python) before python3 on PATH.
mkdir -p "$WORK/venv/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$python" >"$WORK/venv/bin/python"
chmod +x "$WORK/venv/bin/python"
VIRTUAL_ENV=$WORK/venv cpprun --standalone --nproc_per_node=4 train.py
expect_eq "$?" 0 "cpprun train.py's exit code under VIRTUAL_ENV"
expect_in_file "$WORK/err" "cpprun: running train.py with $WORK/venv/bin/python (VIRTUAL_ENV)" "VIRTUAL_ENV's python said"
losses "$WORK/out" >"$WORK/cpprun.venv.losses"
diff "$WORK/reference" "$WORK/cpprun.venv.losses" >&2 || fail "cpprun train.py under VIRTUAL_ENV printed other losses than torchrun"

# -m, both launchers.
torchrun --nproc_per_node=4 -m pkg.ddp_train
losses "$WORK/torchrun.out" >"$WORK/torchrun.module.losses"
diff "$WORK/reference" "$WORK/torchrun.module.losses" >&2 || fail "torchrun -m printed other losses than torchrun train.py"
PATH=$venv_path cpprun --standalone --nproc_per_node=4 -m pkg.ddp_train
expect_eq "$?" 0 "cpprun -m's exit code"
losses "$WORK/out" >"$WORK/cpprun.module.losses"
diff "$WORK/reference" "$WORK/cpprun.module.losses" >&2 || fail "cpprun -m printed other losses than torchrun"

# Two agents on loopback as two nodes of 2 workers; the interpreter named by PYTHON_EXEC.
PYTHON_EXEC=$python start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_port=29561 train.py
node1=$NODE_PID
PYTHON_EXEC=$python start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29561 train.py
node0=$NODE_PID
wait_node "$node0" 120
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 120
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
losses "$WORK/node0.out" >"$WORK/nodes.losses"
diff "$WORK/reference" "$WORK/nodes.losses" >&2 || fail "two nodes of 2 printed other losses than torchrun's 4 ranks"

# --dry_run shows the interpreter and where it came from.
PYTHON_EXEC=$python cpprun --nproc_per_node=2 --dry_run train.py --lr 1
expect_eq "$?" 0 "dry run's exit code"
expect_in_file "$WORK/out" "cpprun: Python runs train.py: $python (PYTHON_EXEC; set PYTHON_EXEC to choose another)" "dry run's interpreter"
expect_in_file "$WORK/out" "command: $python -u train.py --lr 1" "dry run's command"

# --run_path: as torchrun's, a worker whose script ended waits for the node's others before its
# interpreter exits. A Gloo script without destroy_process_group() (PyTorch's own
# test_script_init_method.py) otherwise aborted in 2 runs of 3 ("terminate called without an active
# exception", exit 134) as a peer tore down. Rank 1 ends 0.5 s after the others; rank 0's atexit
# (after the barrier) must come after it. A failing rank does not wait: the job ends with its code.
cat >"$WORK/no_destroy.py" <<'PY'
import atexit, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
rank = dist.get_rank()
if rank == 0:
    atexit.register(lambda: print(f"rank 0 exits at {time.time():.6f}", flush=True))
if rank == 1:
    time.sleep(0.5)
    if len(sys.argv) > 1:
        raise SystemExit(3)
    print(f"rank 1 ends at {time.time():.6f}", flush=True)
PY
for run in 1 2 3; do
  PYTHON_EXEC=$python cpprun --nproc_per_node=4 --run_path "$WORK/no_destroy.py"
  expect_eq "$?" 0 "--run_path without destroy_process_group, run $run: exit code"
done
ended=$(sed -n 's/.*rank 1 ends at //p' "$WORK/out") exited=$(sed -n 's/.*rank 0 exits at //p' "$WORK/out")
[ -n "$ended" ] && [ -n "$exited" ] || fail "--run_path: rank 0's exit or rank 1's end was not printed"
awk -v a="$exited" -v b="$ended" 'BEGIN { exit !(a >= b) }' ||
  fail "--run_path: rank 0 exited at $exited, before rank 1 ended at $ended (no exit barrier)"
PYTHON_EXEC=$python timeout 60 "$CPPRUN" --nproc_per_node=4 --run_path "$WORK/no_destroy.py" fail >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 3 "--run_path with rank 1 exiting 3: exit code"
# A failed script does not wait for the others: rank 0 fails at once while rank 1 sleeps 60 s, so
# a failed rank at the barrier would hold the job past the 30 s limit (124).
cat >"$WORK/fail_fast.py" <<'PY'
import os, sys, time
if os.environ["LOCAL_RANK"] == "1":
    time.sleep(60)
sys.exit(5)
PY
PYTHON_EXEC=$python timeout 30 "$CPPRUN" --nproc_per_node=2 --run_path "$WORK/fail_fast.py" >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 5 "--run_path with rank 0 failing while rank 1 sleeps: exit code (124: the failed rank waited)"
# The barrier's file is absolute: a script that changes directory, under a relative --log_dir, ends well.
cat >"$WORK/chdir.py" <<'PY'
import os
os.chdir("/")
PY
(cd "$WORK" && PYTHON_EXEC=$python CPPRUN_TEST_TAG=$WORK timeout 60 "$CPPRUN" --nproc_per_node=2 --log_dir rel_logs \
  --run_path chdir.py >"$WORK/out" 2>"$WORK/err")
expect_eq "$?" 0 "--run_path with os.chdir under a relative --log_dir: exit code"

# An interpreter without torch: the worker's traceback is in the failure summary.
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && ! "$candidate" -c 'import torch' 2>/dev/null; then
    PYTHON_EXEC=$(command -v "$candidate") cpprun --standalone --nproc_per_node=2 train.py
    expect_eq "$?" 1 "exit code without torch"
    expect_in_file "$WORK/err" "ModuleNotFoundError: No module named 'torch'" "the traceback in the failure summary"
    break
  fi
done
expect_no_leftovers
echo PASS
