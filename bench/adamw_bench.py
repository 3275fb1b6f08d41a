# PyTorch's side of scripts/bench_adamw.sh: torch.optim.AdamW's step time over the parameter list
# bench/adamw_bench.cpp builds (GPT-2's tensors at the given sizes, float32, train_gpt's two
# groups), for each of PyTorch's implementations: fused=True, foreach (the default on CUDA) and the
# for-loop (foreach=False). One RESULT line each, milliseconds per step as the C++ side measures:
# the median of --steps, each timed after the device finished it.
import argparse, time

import torch

p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--layers", type=int, default=12)
p.add_argument("--embed", type=int, default=768)
p.add_argument("--vocab", type=int, default=50304)
p.add_argument("--block", type=int, default=1024)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
device = torch.device(a.device)
c = a.embed
shapes = [(a.vocab, c), (a.block, c)]
for _ in range(a.layers):
    shapes += [(c,), (c,), (c, 3 * c), (3 * c,), (c, c), (c,), (c,), (c,), (c, 4 * c), (4 * c,), (4 * c, c), (c,)]
shapes += [(c,), (c,)]
torch.manual_seed(0)
start = [torch.randn(s, device=device) * 0.02 for s in shapes]
grads = [torch.randn(s, device=device) * 1e-3 for s in shapes]


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


for impl, kwargs in (("torch-fused", {"fused": True}), ("torch-foreach", {"foreach": True}),
                     ("torch-forloop", {"foreach": False})):
    params = [t.clone().requires_grad_() for t in start]
    for t, g in zip(params, grads):
        t.grad = g
    groups = [{"params": [t for t in params if t.dim() >= 2], "weight_decay": 0.1},
              {"params": [t for t in params if t.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=3e-4, **kwargs)
    ms = []
    for step in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        optimizer.step()
        sync()
        if step >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    print(f"RESULT impl={impl} device={a.device} tensors={len(shapes)} params={sum(t.numel() for t in params)} "
          f"ms_per_step={ms[len(ms) // 2]:.3f}", flush=True)
