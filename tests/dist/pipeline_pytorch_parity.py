# The Python side of pipeline_pytorch_parity.sh: PyTorch's own pipelining
# (torch.distributed.pipelining: PipelineStage and its schedules) trains what
# pipeline_pytorch_parity.cpp trains with cpprun's, the same Sequential cut into the same stages,
# from the same parameters on the same batches.
#   python pipeline_pytorch_parity.py init DIR                       the parameters and the batches
#   cpprun --nproc_per_node=2 pipeline_pytorch_parity.py train DIR SCHEDULE   DIR/py_SCHEDULE_r{RANK}.safetensors
#   python pipeline_pytorch_parity.py compare DIR SCHEDULE            PyTorch's losses and final
#                                                                     parameters against cpprun's (1e-10)
import collections
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

STEPS, BATCH, RANKS = 3, 12, 2
# Each configuration's schedule, stages per rank and micro-batches (pipeline_pytorch_parity.cpp's,
# the same); "interleaved-odd" takes PyTorch's flexible rounds (3 micro-batches on 2 ranks: one round).
CONFIGS = {"gpipe": ("gpipe", 1, 4), "1f1b": ("1f1b", 1, 4), "zero-bubble": ("zero-bubble", 1, 4),
           "interleaved-1f1b": ("interleaved-1f1b", 2, 4), "interleaved-odd": ("interleaved-1f1b", 2, 3),
           "looped-bfs": ("looped-bfs", 2, 4)}


def net():
    # The same Sequential as pipeline_pytorch_parity.cpp's: children "0" to "7".
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)).double()


def split(stages):  # the children in `stages` equal runs, as cpprun::split_evenly
    per = 8 // stages
    return [[str(i) for i in range(s * per, (s + 1) * per)] for s in range(stages)]


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "init":
        torch.manual_seed(0)
        save_file({k: v.contiguous() for k, v in net().state_dict().items()}, f"{d}/init.safetensors")
        batches = {}
        for s in range(STEPS):
            batches[f"x{s}"] = torch.randn(BATCH, 8, dtype=torch.float64)
            batches[f"y{s}"] = torch.randn(BATCH, 4, dtype=torch.float64)
        save_file(batches, f"{d}/batches.safetensors")
        return
    name = sys.argv[3]
    if mode == "compare":
        def merged(side):
            out = {}
            for r in range(RANKS):
                out.update(load_file(f"{d}/{side}_{name}_r{r}.safetensors"))
            return out
        py, cpp, init = merged("py"), merged("cpp"), load_file(f"{d}/init.safetensors")
        names = sorted(init)
        missing = [k for k in names + ["losses"] if k not in py or k not in cpp]
        if missing:
            print(f"{name}: missing from a side: {missing}")
            sys.exit(1)
        def gap(k):
            return ((py[k] - cpp[k]).abs().max() / py[k].abs().max()).item()
        worst = max(names, key=gap)
        moved = min(((py[k] - init[k]).abs().max() / init[k].abs().max()).item() for k in names)
        print(f"{name}: cpprun's pipeline against PyTorch's after {STEPS} steps of {CONFIGS[name][2]} micro-batches: "
              f"losses within {gap('losses'):.3g}, parameters within {gap(worst):.3g} ({worst}), "
              f"each moved at least {moved:.3g}")
        sys.exit(0 if gap(worst) < 1e-10 and gap("losses") < 1e-10 and moved > 1e-3 else 1)
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble, ScheduleLoopedBFS)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = net()
    model.load_state_dict(load_file(f"{d}/init.safetensors"))
    kind, v, m = CONFIGS[name]
    cut = split(world * v)
    indices = [rank + k * world for k in range(v)]  # stage s on rank s % world, as cpprun's
    stages = [PipelineStage(torch.nn.Sequential(collections.OrderedDict((n, model.get_submodule(n)) for n in cut[i])),
                            i, world * v, torch.device("cpu")) for i in indices]
    mse = torch.nn.functional.mse_loss
    schedule = {"gpipe": lambda: ScheduleGPipe(stages[0], m, loss_fn=mse),
                "1f1b": lambda: Schedule1F1B(stages[0], m, loss_fn=mse),
                "zero-bubble": lambda: ScheduleInterleavedZeroBubble(stages, m, loss_fn=mse),
                "interleaved-1f1b": lambda: ScheduleInterleaved1F1B(stages, m, loss_fn=mse),
                "looped-bfs": lambda: ScheduleLoopedBFS(stages, m, loss_fn=mse)}[kind]()
    mine = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(mine, lr=0.1, momentum=0.9, foreach=False)
    # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
    # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
    batches = {k: v.clone() for k, v in load_file(f"{d}/batches.safetensors").items()}
    last = any(s.is_last for s in stages)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        micro = []
        args = [batches[f"x{s}"]] if any(st.is_first for st in stages) else []
        schedule.step(*args, target=batches[f"y{s}"] if last else None, losses=micro)
        if last:
            losses.append(torch.stack(micro).mean().item())
        opt.step()
    out = {f"{n}.{k}": t.detach().contiguous() for s, i in zip(stages, indices)
           for n in cut[i] for k, t in model.get_submodule(n).named_parameters()}
    if last:
        out["losses"] = torch.tensor(losses, dtype=torch.float64)
    save_file(out, f"{d}/py_{name}_r{rank}.safetensors")
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads can abort a rank at interpreter finalization: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
