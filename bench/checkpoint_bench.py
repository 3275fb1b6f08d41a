# bench/checkpoint_bench.cpp's PyTorch twin: the same model (Linear(H, H) + ReLU x LAYERS), AdamW
# stepped once, under PyTorch's DDP ("ddp") or FSDP2 ("zero3": fully_shard on each Linear, then
# the root, on a CPU mesh over Gloo), saved and loaded with torch.distributed.checkpoint:
#   save   dcp.save({"model": ..., "optim": ...}) of get_state_dict(model, opt), into an emptied DIR
#          (FileSystemWriter's defaults: every rank writes its file, fsynced);
#   load   get_state_dict, dcp.load, set_state_dict, after rank 0 drops the page cache
#          (--drop-caches, as the C++ side);
#   async  dcp.async_save(...) (its default thread executor, on a Gloo group of its own, as
#          torchtitan gives it): how long the call blocks, how long until the future is done on
#          every rank, and the training steps run meanwhile.
# One RESULT line (rank 0's) with bench/checkpoint_bench.cpp's field names; medians of --repeats.
#   cpprun --nproc_per_node=2 bench/checkpoint_bench.py --mode ddp --dir /tmp/ckpt_bench_py/
import argparse, os, resource, shutil, sys, time
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["ddp", "zero3"], default="ddp")
p.add_argument("--dir", default="/tmp/cpprun_checkpoint_bench_py/")
p.add_argument("--hidden", type=int, default=2048)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--drop-caches", action="store_true")
a = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank0 = dist.get_rank() == 0
checkpoint_group = dist.new_group(backend="gloo")  # async_save's collectives run on its thread
torch.manual_seed(0)
layers = []
for _ in range(a.layers):
    layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
net = torch.nn.Sequential(*layers)
params = sum(t.numel() for t in net.parameters())
if a.mode == "ddp":
    model = DDP(net)
else:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for m in net.modules():
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(a.batch, a.hidden), torch.randn(a.batch, a.hidden)

def step():
    start = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return time.perf_counter() - start

def timed(phase):  # between barriers: the slowest rank's time
    dist.barrier()
    start = time.perf_counter()
    phase()
    dist.barrier()
    return time.perf_counter() - start

def empty_dir():
    if rank0:
        shutil.rmtree(a.dir, ignore_errors=True)
    dist.barrier()

def state():
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}

def load():
    sd = state()
    dcp.load(sd, checkpoint_id=a.dir)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False

def cpu_s():  # this process's user + system time so far, every thread
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime

def median(v):
    v = sorted(v)
    return v[(len(v) - 1) // 2] if v else 0.0

step()  # AdamW's state exists from here
step()  # warm-up
saves, loads, save_cpu, load_cpu, nbytes, cold = [], [], [], [], 0, a.drop_caches
for _ in range(a.repeats):
    empty_dir()
    cpu = cpu_s()
    saves.append(timed(lambda: dcp.save(state(), checkpoint_id=a.dir)))
    save_cpu.append(cpu_s() - cpu)
    if rank0:
        nbytes = sum(os.path.getsize(os.path.join(a.dir, f)) for f in os.listdir(a.dir))
    if a.drop_caches:
        if rank0:
            cold = drop_page_cache() and cold
        dist.barrier()
    cpu = cpu_s()
    loads.append(timed(load))
    load_cpu.append(cpu_s() - cpu)

plain = [step() for _ in range(3)]
blocks, dones, during, spanned = [], [], [], []
for _ in range(a.repeats):
    empty_dir()
    dist.barrier()
    start = time.perf_counter()
    future = dcp.async_save(state(), checkpoint_id=a.dir, process_group=checkpoint_group)
    blocks.append(time.perf_counter() - start)
    steps = 0
    while True:
        done = torch.tensor([1 if future.done() else 0], dtype=torch.int)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item() == 1 or steps >= 100:
            break
        during.append(step())
        steps += 1
    future.result()
    dones.append(time.perf_counter() - start)
    spanned.append(steps)

if rank0:
    gb = nbytes / 1e9
    print(f"RESULT mode={a.mode} world={dist.get_world_size()} params={params} bytes={nbytes} "
          f"cache={'cold' if cold else 'warm'} save_s={median(saves):.4f} save_cpu_s={median(save_cpu):.4f} "
          f"save_gbps={gb / median(saves):.3f} load_s={median(loads):.4f} load_cpu_s={median(load_cpu):.4f} "
          f"load_gbps={gb / median(loads):.3f} step_s={median(plain):.4f} async_block_s={median(blocks):.4f} "
          f"async_done_s={median(dones):.4f} during_step_s={median(during):.4f} steps_during={median(spanned):.0f}",
          flush=True)
dist.barrier()
if rank0:
    shutil.rmtree(a.dir, ignore_errors=True)
dist.destroy_process_group()
# PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
