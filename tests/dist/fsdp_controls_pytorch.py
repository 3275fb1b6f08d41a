# The Python side of fsdp_controls_pytorch.sh, on 2 ranks under cpprun: trains the model of
# fsdp_controls_pytorch.cpp with PyTorch's fully_shard (FSDP2, a unit per Linear) and the same
# calls, from the initial weights and data cpprun wrote to DIR/cpprun.safetensors, and compares
# the trained parameters with cpprun's (float64): the biases bit for bit, the weights to relative
# 1e-12 (their gradients' matmuls round differently in the last bit on the two sides; the biases'
# sums do not, so they show any difference in the reductions' arithmetic). Exit 1 on a difference.
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

STEPS, MICRO, BATCH = 2, 3, 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 9)
        self.fc2 = torch.nn.Linear(9, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_default_dtype(torch.float64)
    # Fresh, aligned copies: a tensor read at an odd offset of the file takes other vector paths,
    # whose sums round otherwise in the last bit (the hook case did, once the file held one more case).
    t = {k: v.clone() for k, v in load_file(sys.argv[1] + "/cpprun.safetensors").items()}
    init = {k[len("init."):]: v for k, v in t.items() if k.startswith("init.")}
    x, y = t["x"], t["y"]
    failed = False
    for kind in ("accumulate", "hsdp", "divide", "divide_sum", "hook", "mixed", "frozen"):
        model = Net()
        model.load_state_dict(init)
        if kind == "frozen":
            model.fc1.weight.requires_grad_(False)
        if kind == "hsdp":
            mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (2,))
        mp = MixedPrecisionPolicy(reduce_dtype=torch.float32 if kind == "divide_sum" else None,
                                  param_dtype=torch.bfloat16 if kind in ("mixed", "frozen") else None)
        fully_shard(model.fc1, mesh=mesh, mp_policy=mp)
        fully_shard(model.fc2, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        # FSDP2's two setters act on the module's own parameter group only (no recurse): cpprun's
        # act on every unit, as calling them on each fully_shard module does.
        for module in (model.fc1, model.fc2, model):
            if kind in ("divide", "divide_sum", "hook"):
                module.set_gradient_divide_factor(3.0)
            if kind == "hook":
                module.set_all_reduce_hook(lambda rows: rows.add_(0.01))
            if kind == "divide_sum":
                module.set_force_sum_reduction_for_comms(True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            opt.zero_grad()
            for micro in range(MICRO):
                last = micro == MICRO - 1
                if kind in ("accumulate", "mixed", "frozen"):
                    model.set_requires_gradient_sync(last)
                    model.set_reshard_after_backward(last)
                elif kind != "hsdp":
                    pass  # every micro-batch synchronized
                elif micro == 0:
                    model.set_requires_gradient_sync(False)
                elif micro == 1:
                    model.set_requires_gradient_sync(True)
                    model.set_requires_all_reduce(False)
                else:
                    model.set_requires_all_reduce(True)
                b = step * MICRO + micro
                local = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
                torch.nn.functional.cross_entropy(model(x[b][local]), y[b][local]).backward()
            opt.step()
        for name, p in model.named_parameters():
            full = p.full_tensor().detach()
            theirs = t[kind + "." + name]
            rel = ((full - theirs).abs().max() / theirs.abs().max()).item()
            ok = torch.equal(full, theirs) if name.endswith("bias") else rel <= 1e-12
            if kind == "frozen" and name == "fc1.weight":
                ok = ok and torch.equal(full, init[name])  # frozen: trained by neither
            failed |= not ok
            if rank == 0:
                print(f"{kind} {name}: relative difference {rel:.3g} {'ok' if ok else 'DIFFERS'}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(1 if failed else 0)


main()
