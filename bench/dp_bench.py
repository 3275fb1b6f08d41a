# The PyTorch side of scripts/bench_ddp.sh and bench_fsdp.sh: the same model, data and steps as
# bench/dp_bench.cpp, run by PyTorch 2.15 from the project's .venv (scripts/setup.sh installs it;
# the same LibTorch the C++ side links). Modes: torch.nn.parallel.DistributedDataParallel over
# Gloo ("ddp"); DDP with ZeroRedundancyOptimizer ("zero1": PyTorch's ZeRO-1); FSDP2's
# fully_shard on each nn.Linear and then the root, like our zero3's one unit per Linear, with
# reshard_after_forward=True ("fsdp2", ZeRO-3) or False ("fsdp2_noreshard", ZeRO-2-like), on a
# CPU device mesh over Gloo; the same work without communication ("local"); or one all-reduce of
# all the gradients alone ("allreduce"). Started by cpprun, which sets the same environment as
# torchrun. Prints one RESULT line shaped like the C++ one; peak_rss_mb: how far the process's
# peak resident memory (ru_maxrss) rose above its resident size just after init_process_group,
# before the model was built (bench/dp_bench.cpp measures the same way). --frozen 1 freezes every
# Linear's weight but the last before wrapping (requires_grad False), as dp_bench's --frozen 1.
import argparse, os, resource, sys, time
import torch, torch.distributed as dist
# Loaded here, before peak_rss_mb's baseline, rather than lazily inside it: the first optimizer a
# process builds imports torch._dynamo (and with it sympy, inductor, ...), about 100 MB resident
# of Python code loading that the C++ side has no counterpart of.
import torch._dynamo
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--mode", default="ddp",
               choices=["ddp", "zero1", "fsdp2", "fsdp2_noreshard", "local", "allreduce"])
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--bucket-view", action="store_true", help="DDP with gradient_as_bucket_view=True")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: GPU LOCAL_RANK, NCCL")
p.add_argument("--frozen", default="0", choices=["0", "1"], help="1: every weight but the head's frozen")
a = p.parse_args()

def resident_mb():  # this process's resident memory now: /proc/self/statm's second field, in pages
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") / (1 << 20)

def peak_resident_mb():  # the most this process has been resident, ever (ru_maxrss: KiB on Linux)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

torch.set_num_threads(1)
if a.device == "cuda":
    if not torch.cuda.is_available():
        raise SystemExit("dp_bench.py: --device cuda: this torch sees no CUDA GPU")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
rss_before_model = resident_mb()
torch.manual_seed(0)
layers = [torch.nn.Linear(1024, a.hidden), torch.nn.ReLU()]
for _ in range(3):
    layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
net = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 10)).to(device)
params = sum(t.numel() for t in net.parameters())  # before fully_shard turns them into shards
if a.frozen == "1":  # a LoRA-style fine-tune's base: DDP and FSDP2 skip these in their reductions
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    for m in linears[:-1]:
        m.weight.requires_grad_(False)
if a.mode in ("ddp", "zero1"):
    model = DDP(net, gradient_as_bucket_view=a.bucket_view)
elif a.mode in ("fsdp2", "fsdp2_noreshard"):
    try:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        reshard = a.mode == "fsdp2"
        for m in net.modules():
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
        model = fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
    except Exception as e:
        print(f"dp_bench.py: --mode {a.mode}: fully_shard failed on {device.type}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        os._exit(3)  # no destroy_process_group: the other ranks may be stuck in a collective
else:
    model = net
x, y = torch.randn(a.batch, 1024).to(device), torch.randint(0, 10, (a.batch,)).to(device)
if a.mode == "zero1":
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01, momentum=0.9)
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

if a.mode == "allreduce":  # only here: in the other modes it would count in peak_rss_mb
    gradients = torch.randn(params).to(device)

def step():
    if a.mode == "allreduce":
        dist.all_reduce(gradients)
        gradients.div_(dist.get_world_size())
        return
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

def cpu_ms():  # this process's user + system time, every thread
    u = resource.getrusage(resource.RUSAGE_SELF)
    return (u.ru_utime + u.ru_stime) * 1000

def finish_kernels():  # GPU kernels run asynchronously: wait for them before reading the clock
    if a.device == "cuda":
        torch.cuda.synchronize(device)

for _ in range(a.warmup):
    step()
finish_kernels()
dist.barrier()
cpu_start, start = cpu_ms(), time.perf_counter()
for _ in range(a.steps):
    step()
finish_kernels()
dist.barrier()
ms = (time.perf_counter() - start) * 1000 / a.steps
cpu = (cpu_ms() - cpu_start) / a.steps
peak_rss = peak_resident_mb() - rss_before_model
if dist.get_rank() == 0:
    print(f"RESULT impl=pytorch mode={a.mode} device={a.device} params={params} frozen={a.frozen} "
          f"world={dist.get_world_size()} "
          f"ms_per_step={ms:.2f} cpu_ms_per_step={cpu:.2f} samples_per_s={1000 * a.batch * dist.get_world_size() / ms:.1f} peak_rss_mb={peak_rss:.1f}", flush=True)
dist.barrier()  # no rank tears Gloo down while rank 0 still prints (tests/dist/dcp_interop.py's flake)
dist.destroy_process_group()
# PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
