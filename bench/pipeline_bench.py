# The PyTorch side of scripts/bench_pipeline.sh: bench/pipeline_bench.cpp's model, split, batch
# and steps under torch.distributed.pipelining (PipelineStage, ScheduleGPipe, Schedule1F1B,
# ScheduleInterleaved1F1B) over Gloo, started by torchrun; the same flags and RESULT line.
#
#   python -m torch.distributed.run --standalone --nproc_per_node=2 bench/pipeline_bench.py --schedule 1f1b --microbatches 4
#   python bench/pipeline_bench.py --schedule none   (the whole model in one process, no pipeline)
#
# PyTorch's schedules give no waiting time, so bubble is "-": blocked (the part of the step the main
# thread slept) is the figure both sides give, runq the part it waited for a core. peak_held is "-" too. A schedule that fails
# prints one ERROR line (the exception's type and first line) and exits 1; torchrun then stops the
# other ranks and the script carries on with the next configuration.
import argparse, collections, os, resource, sys, time

import torch, torch.distributed as dist
# Imported before the resident-size baseline, not lazily by the first step: Python code loading
# that the C++ side has no counterpart of would otherwise count as activation memory.
import torch._dynamo  # noqa: F401
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                         ScheduleInterleavedZeroBubble, ScheduleLoopedBFS)

INPUTS, OUTPUTS = 64, 16

p = argparse.ArgumentParser()
p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved", "looped", "zb", "none"])
p.add_argument("--microbatches", type=int, default=4)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--batch", type=int, default=2048)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--stages-per-rank", type=int, default=2)
a = p.parse_args()


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_model():
    torch.manual_seed(0)
    children = [("in", torch.nn.Linear(INPUTS, a.dim))]
    children += [(f"block{i}", Block(a.dim)) for i in range(a.layers)]
    children.append(("head", torch.nn.Linear(a.dim, OUTPUTS)))
    return torch.nn.Sequential(collections.OrderedDict(children))


def block_split(stages):  # layers / stages blocks a stage, "in" with the first and "head" with the last
    per = a.layers // stages
    return [(["in"] if s == 0 else []) + [f"block{b}" for b in range(s * per, (s + 1) * per)] +
            (["head"] if s == stages - 1 else []) for s in range(stages)]


def resident_bytes():  # /proc/self/statm's second field, in pages
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


def peak_resident_bytes():  # ru_maxrss: KiB on Linux (VmHWM, as bench/peak_rss.h reads)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sched_times():  # the main thread's seconds on a core and ready but waiting for one (/proc/self/schedstat)
    with open("/proc/self/schedstat") as f:
        on_cpu, runnable = f.read().split()[:2]
    return int(on_cpu) * 1e-9, int(runnable) * 1e-9


def median(values):  # the lower middle for an even count, as bench/median.h
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def mse(output, target):
    return torch.nn.functional.mse_loss(output, target)


pipelined = a.schedule != "none"
if pipelined:
    dist.init_process_group("gloo")
world, rank = (dist.get_world_size(), dist.get_rank()) if pipelined else (1, 0)
v = a.stages_per_rank if a.schedule in ("interleaved", "looped") else 1
if a.layers % (world * v):
    sys.exit(f"pipeline_bench.py: --layers {a.layers} does not divide into {world * v} stages of equal blocks "
             f"({world} ranks x {v} per rank)")
model = make_model()
torch.manual_seed(1)
x, y = torch.randn(a.batch, INPUTS), torch.randn(a.batch, OUTPUTS)


def fail(e):
    line = (str(e).strip().splitlines() or [""])[0]
    os.write(1, f"ERROR impl=pytorch schedule={a.schedule} p={world} m={a.microbatches} rank={rank}: "
                f"{type(e).__name__}: {line}\n".encode())
    os._exit(1)


indices = [rank + k * world for k in range(v)]
try:
    if pipelined:
        split = block_split(world * v)
        stages = [PipelineStage(torch.nn.Sequential(collections.OrderedDict((n, model.get_submodule(n)) for n in split[i])),
                                i, world * v, torch.device("cpu")) for i in indices]
        params = [t for s in stages for t in s.submod.parameters()]
        if a.schedule == "gpipe":
            schedule = ScheduleGPipe(stages[0], a.microbatches, loss_fn=mse)
        elif a.schedule == "1f1b":
            schedule = Schedule1F1B(stages[0], a.microbatches, loss_fn=mse)
        elif a.schedule == "zb":  # PyTorch's zero bubble (ZB1P), here with one stage per rank
            schedule = ScheduleInterleavedZeroBubble(stages, a.microbatches, loss_fn=mse)
        elif a.schedule == "looped":
            schedule = ScheduleLoopedBFS(stages, a.microbatches, loss_fn=mse)
        else:
            schedule = ScheduleInterleaved1F1B(stages, a.microbatches, loss_fn=mse)
        first, last = 0 in indices, world * v - 1 in indices
    else:
        params = list(model.parameters())
except Exception as e:  # noqa: BLE001 -- reported, and the script goes on
    fail(e)
# A few rows through each of this rank's modules first, as the C++ side does: the kernels' and the
# BLAS's one-time buffers are no activation memory.
for module, width in ([(s.submod, INPUTS if s.is_first else a.dim) for s in stages] if pipelined else [(model, INPUTS)]):
    module(torch.randn(8, width)).sum().backward()
if pipelined:
    dist.barrier()
rss_built = resident_bytes()

wall, blocked, runq = [], [], []
for step in range(a.warmup + a.steps):
    for t in params:
        t.grad = None
    if pipelined:
        dist.barrier()  # every rank starts the step together
    cpu0, runnable0 = sched_times()
    t0 = time.perf_counter()
    try:
        if pipelined:
            schedule.step(*((x,) if first else ()), target=y if last else None, return_outputs=False)
        else:
            mse(model(x), y).backward()
    except Exception as e:  # noqa: BLE001
        fail(e)
    seconds = time.perf_counter() - t0
    cpu1, runnable1 = sched_times()
    if step >= a.warmup:
        wall.append(seconds)
        blocked.append(max(0.0, 1 - (cpu1 - cpu0 + runnable1 - runnable0) / seconds))
        runq.append(min(1.0, (runnable1 - runnable0) / seconds))
act_mb = (peak_resident_bytes() - rss_built) / (1 << 20)
m = a.microbatches
formula, issue_formula = (world - 1) / (v * m + world - 1), (world - 1) / (v * m)
if a.schedule == "zb":  # ZB-H1's ideal with F = I = W, as the C++ side
    formula, issue_formula = (world - 1) / (3 * m + world - 1), (world - 1) / (3 * m)
ms = median(wall) * 1e3
line = (f"RESULT impl=pytorch schedule={a.schedule} p={world} v={v} m={m if pipelined else 1} rank={rank} "
      f"stages={','.join(map(str, indices)) if pipelined else 'all'} layers={a.layers} dim={a.dim} batch={a.batch} "
      f"threads={torch.get_num_threads()} ms_per_step={ms:.3f} bubble=- blocked={median(blocked):.4f} "
      f"runq={median(runq):.4f} "
      f"formula={formula:.4f} issue_formula={issue_formula:.4f} peak_held=- rows_per_s={a.batch / (ms / 1e3):.1f} "
      f"act_mb={act_mb:.1f}\n")
os.write(1, line.encode())  # one write: the ranks share torchrun's stdout
if pipelined:
    dist.barrier()  # no rank tears down while another still prints
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
