# The Python side of tp_pytorch_parity.sh: PyTorch's own tensor parallelism
# (torch.distributed.tensor.parallel.parallelize_module, DTensor) trains what tp_pytorch_parity.cpp
# trains with cpprun's, from the same parameters on the same batches, under the same plan.
#   python tp_pytorch_parity.py init DIR                 the parameters and the batches
#   cpprun --nproc_per_node=2 tp_pytorch_parity.py train DIR PLAN    DIR/py_PLAN.safetensors
#   python tp_pytorch_parity.py compare DIR PLAN          PyTorch's losses and final parameters
#                                                         against cpprun's (1e-10)
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

STEPS, BATCH, SEQ, VOCAB, WIDTH, HIDDEN = 5, 4, 8, 32, 16, 32


def net():
    # The same Sequential as tp_pytorch_parity.cpp's: its children are named "0" to "6" on both sides.
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.GELU(), torch.nn.Linear(HIDDEN, WIDTH), torch.nn.LayerNorm(WIDTH),
        torch.nn.Linear(WIDTH, VOCAB)).double()


def plan(name):
    # tp_pytorch_parity.cpp's plans, the same styles with the same layouts.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    if name == "megatron":  # the embedding split by columns, LayerNorms whole on whole activations
        return {"0": ColwiseParallel(output_layouts=Replicate()), "2": ColwiseParallel(),
                "4": RowwiseParallel(), "6": ColwiseParallel(output_layouts=Replicate())}
    # sequence parallel, as torchtitan's Llama plan: the embedding split by rows (vocabulary) and
    # reduce-scattered along the sequence; LayerNorms on sequence shards
    return {"0": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)), "1": SequenceParallel(),
            "2": ColwiseParallel(input_layouts=Shard(1)), "4": RowwiseParallel(output_layouts=Shard(1)),
            "5": SequenceParallel(), "6": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "init":
        torch.manual_seed(0)
        model = net()
        for p in model.parameters():  # LayerNorm's ones and zeros would hide a missing gradient sum
            p.data.add_(0.1 * torch.randn_like(p))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{d}/init.safetensors")
        batches = {}
        for s in range(STEPS):
            batches[f"x{s}"] = torch.randint(VOCAB, (BATCH, SEQ))
            batches[f"y{s}"] = torch.randint(VOCAB, (BATCH, SEQ))
        save_file(batches, f"{d}/batches.safetensors")
        return
    name = sys.argv[3]
    if mode == "compare":
        py, cpp = load_file(f"{d}/py_{name}.safetensors"), load_file(f"{d}/cpp_{name}.safetensors")
        init = load_file(f"{d}/init.safetensors")
        names = sorted(init)
        missing = [k for k in names if k not in py or k not in cpp]
        if missing:
            print(f"{name}: parameters missing from a side: {missing}")
            sys.exit(1)
        worst = max(((py[k] - cpp[k]).abs().max() / py[k].abs().max()).item() for k in names)
        worst_name = max(names, key=lambda k: ((py[k] - cpp[k]).abs().max() / py[k].abs().max()).item())
        moved = min(((py[k] - init[k]).abs().max() / init[k].abs().max()).item() for k in names)
        loss_gap = ((py["losses"] - cpp["losses"]).abs() / py["losses"].abs()).max().item()
        print(f"{name}: cpprun's tensor parallelism against PyTorch's after {STEPS} AdamW steps: losses within "
              f"{loss_gap:.3g}, parameters within {worst:.3g} ({worst_name}), each moved at least {moved:.3g}")
        sys.exit(0 if worst < 1e-10 and loss_gap < 1e-10 and moved > 1e-3 else 1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = net()
    model.load_state_dict(load_file(f"{d}/init.safetensors"))
    parallelize_module(model, mesh, plan(name))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
    # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
    batches = {k: v.clone() for k, v in load_file(f"{d}/batches.safetensors").items()}
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        logits = model(batches[f"x{s}"])
        if isinstance(logits, DTensor):
            logits = logits.full_tensor()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batches[f"y{s}"].flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).contiguous() for k, v in model.state_dict().items()}
    if dist.get_rank() == 0:
        full["losses"] = torch.tensor(losses, dtype=torch.float64)
        save_file(full, f"{d}/py_{name}.safetensors")
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads can abort a rank at interpreter finalization: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
