# The PyTorch side of scripts/bench_ddp.sh and bench_fsdp.sh: the same model, data and steps as
# bench/dp_bench.cpp, with torch.nn.parallel.DistributedDataParallel over Gloo ("ddp"), and DDP
# with ZeroRedundancyOptimizer ("zero1": PyTorch's ZeRO-1; its FSDP cannot be imported from
# Debian's 1.13 under Python 3.11), the same work without communication ("local"), or one
# all-reduce of all the gradients alone ("allreduce"). Started by cpprun, which sets the same
# environment as torchrun (Debian's torchrun crashes at its defaults on Python 3.11).
import argparse, os, resource, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--mode", default="ddp", choices=["ddp", "zero1", "local", "allreduce"])
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--bucket-view", action="store_true", help="DDP with gradient_as_bucket_view=True")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: GPU LOCAL_RANK, NCCL")
a = p.parse_args()

torch.set_num_threads(1)
if a.device == "cuda":
    if not torch.cuda.is_available():
        raise SystemExit("dp_bench.py: --device cuda: this torch sees no CUDA GPU")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
torch.manual_seed(0)
layers = [torch.nn.Linear(1024, a.hidden), torch.nn.ReLU()]
for _ in range(3):
    layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
net = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 10)).to(device)
model = DDP(net, gradient_as_bucket_view=a.bucket_view) if a.mode in ("ddp", "zero1") else net
x, y = torch.randn(a.batch, 1024).to(device), torch.randint(0, 10, (a.batch,)).to(device)
if a.mode == "zero1":
    from torch.distributed.optim import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01, momentum=0.9)
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

gradients = torch.randn(sum(t.numel() for t in net.parameters())).to(device)

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
params = sum(t.numel() for t in net.parameters())
if dist.get_rank() == 0:
    print(f"RESULT impl=pytorch mode={a.mode} device={a.device} params={params} world={dist.get_world_size()} "
          f"ms_per_step={ms:.2f} cpu_ms_per_step={cpu:.2f} samples_per_s={1000 * a.batch * dist.get_world_size() / ms:.1f}", flush=True)
dist.destroy_process_group()
