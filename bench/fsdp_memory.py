# The PyTorch side of scripts/bench_frozen.sh: bench/fsdp_memory.cpp's model and steps under
# PyTorch's FSDP2 (fully_shard per Linear, then the root), reporting the same steady-state bytes per
# rank after three AdamW steps: the parameters' local shards, their gradients, AdamW's state.
#   cpprun --nproc_per_node=N python bench/fsdp_memory.py [--frozen 1]
# --frozen 1: every Linear's weight but the last frozen (requires_grad false) before wrapping, as
# fsdp_memory --frozen 1: a LoRA-style fine-tune's base, which FSDP2 shards and never reduces.
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def local_bytes(t):
    if t is None:
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--frozen", default="0")
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    h = args.hidden
    layers = [torch.nn.Linear(1024, h), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(h, h), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(h, 10))
    net = torch.nn.Sequential(*layers)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    if args.frozen == "1":
        for m in linears[:-1]:
            m.weight.requires_grad_(False)
    psi = sum(p.numel() for p in net.parameters())
    for m in linears:
        fully_shard(m)
    fully_shard(net)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randn(16, 1024)
    y = torch.randint(0, 10, (16,))
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    params = sum(local_bytes(p) for p in net.parameters())
    grads = sum(local_bytes(p.grad) for p in net.parameters())
    optim = sum(local_bytes(s[k]) for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    if dist.get_rank() == 0:
        print(f"RESULT impl=fsdp2 frozen={args.frozen} world={dist.get_world_size()} psi={psi} params={params} "
              f"grads={grads} optim={optim}", flush=True)
    dist.destroy_process_group()
    os._exit(0)


main()
