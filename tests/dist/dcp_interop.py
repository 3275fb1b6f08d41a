"""The PyTorch side of dcp_interop.sh: FSDP2 (fully_shard) on 2 ranks, CPU and Gloo, float64,
AdamW under a LambdaLR, saving and loading with torch.distributed.checkpoint as torchtitan does
(the model's names at the top level, "optimizer" the flattened optimizer state dict,
train_state, lr_scheduler and a per-rank dataloader entry beside them).

  dcp_interop.py init DIR      DIR/batches.safetensors, DIR/init.safetensors (one process)
  dcp_interop.py train DIR     (2 ranks) from init, 3 steps, dcp.save to DIR/dcp, 3 more steps,
                               the parameters to DIR/py_final.safetensors
  dcp_interop.py resume DIR    (2 ranks) another seed and lr; dcp.load DIR/to_dcp (dcp_convert.py
                               to-dcp of cpprun's save), set_state_dict, 3 steps, compared with
                               DIR/cpp_final.safetensors (cpprun's own 3 steps): 1e-10
  dcp_interop.py same A B      two cpprun directories hold the same tensors, bit for bit, and
                               the same param groups (one process)
  dcp_interop.py forms DIR     one process, no process group: the same AdamW state dcp.save'd as
                               {"model", "optimizer"} flattened (DIR/form_flat_dcp), not flattened
                               (DIR/form_nested_dcp, get_state_dict's default) and as optimizer.state_dict()
                               (DIR/form_by_index_dcp, keyed by index)
"""
import json
import os
import pickle
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

BEFORE, AFTER = 3, 3
MICRO_BATCHES = 2  # backwards per step, each reducing its gradients
TOLERANCE = 1e-10
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)  # torchtitan's optimizer form


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def sharded(seed):
    torch.manual_seed(seed)
    model = Net()
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    return model


def step(model, optim, scheduler, batches, s):
    """Step s on this rank's rows, as MICRO_BATCHES backwards that each reduce-scatter (no
    set_requires_gradient_sync(False)): FSDP2 adds each one's sharded gradient to the last, and so
    must cpprun's FSDP (a shard gradient replaced instead would differ here by far more than 1e-10)."""
    rows = 12 // dist.get_world_size()
    first = dist.get_rank() * rows
    optim.zero_grad()
    x, y = batches[f"x{s}"][first:first + rows], batches[f"y{s}"][first:first + rows]
    for xm, ym in zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES)):
        (torch.nn.functional.mse_loss(model(xm), ym) / MICRO_BATCHES).backward()
    optim.step()
    scheduler.step()


def full_parameters(model):
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.contiguous() for k, v in full.items()}


def constant(optim):
    """torchtitan's scheduler, a LambdaLR, here at a constant factor 1: the lr stays the group's
    initial_lr (which LambdaLR adds to each group, and each step sets the lr from)."""
    return torch.optim.lr_scheduler.LambdaLR(optim, lambda _: 1.0)


def states(model_sd, model, optim, scheduler, step_count):
    """What torchtitan's CheckpointManager gives dcp.save: the model's names at the top level."""
    return {
        **model_sd,
        "optimizer": get_optimizer_state_dict(model, optim, options=FLAT),
        "train_state": {"step": step_count, "ntokens_seen": 12 * step_count},
        "lr_scheduler": {"last_epoch": scheduler.last_epoch},
        "dataloader": {f"dp_rank_{dist.get_rank()}": pickle.dumps({"sample_index": 12 * step_count})},
    }


def train(d, batches):
    model = sharded(1)
    set_model_state_dict(model, load_file(f"{d}/init.safetensors"), options=StateDictOptions(full_state_dict=True))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    scheduler = constant(optim)
    for s in range(BEFORE):
        step(model, optim, scheduler, batches, s)
    dcp.save(states(get_model_state_dict(model), model, optim, scheduler, BEFORE), checkpoint_id=f"{d}/dcp")
    for s in range(BEFORE, BEFORE + AFTER):
        step(model, optim, scheduler, batches, s)
    final = full_parameters(model)
    if dist.get_rank() == 0:
        save_file(final, f"{d}/py_final.safetensors")
    return 0


def resume(d, batches):
    model = sharded(7)
    optim = torch.optim.AdamW(model.parameters(), lr=0.5)  # the checkpoint's lr (0.01) must win
    scheduler = constant(optim)  # its initial_lr 0.5: the checkpoint's (0.01, through --extra) must win
    # docs/checkpoints.md's snippet, with torchtitan's other entries in the template too.
    model_sd = get_model_state_dict(model)
    state = states(model_sd, model, optim, scheduler, 0)
    dcp.load(state, checkpoint_id=f"{d}/to_dcp")
    set_model_state_dict(model, {k: state[k] for k in model_sd})
    set_optimizer_state_dict(model, optim, state["optimizer"], options=FLAT)
    faults = []
    group = optim.param_groups[0]
    if (group["lr"], group["weight_decay"], group["initial_lr"]) != (0.01, 0.05, 0.01):
        faults.append(f"the loaded options are lr {group['lr']}, weight_decay {group['weight_decay']}, "
                      f"initial_lr {group['initial_lr']}, not 0.01, 0.05, 0.01")
    # Made before the load, so that the template holds initial_lr (as torchtitan's does), the
    # scheduler's base_lrs are the lr it was made with: take the checkpoint's, and its epoch.
    scheduler.base_lrs = [g["initial_lr"] for g in optim.param_groups]
    scheduler.last_epoch = state["lr_scheduler"]["last_epoch"]
    # dcp_extra.pt's entries (train_state, lr_scheduler, each rank's dataloader) came back.
    expected_loader = pickle.dumps({"sample_index": 12 * BEFORE})
    if (state["train_state"]["step"], state["lr_scheduler"]["last_epoch"]) != (BEFORE, BEFORE) or \
            state["dataloader"][f"dp_rank_{dist.get_rank()}"] != expected_loader:
        faults.append(f"train_state {state['train_state']}, lr_scheduler {state['lr_scheduler']}, "
                      f"dataloader {state['dataloader']}: not those PyTorch saved at step {BEFORE}")
    for s in range(BEFORE, BEFORE + AFTER):
        step(model, optim, scheduler, batches, s)
    ours = full_parameters(model)
    if dist.get_rank() == 0:
        theirs = load_file(f"{d}/cpp_final.safetensors")
        worst = torch.stack([(ours[n] - theirs[n]).abs().max() for n in theirs]).max().item()  # NaN stays
        print(f"PyTorch's {AFTER} steps from cpprun's checkpoint (through DCP) against cpprun's own: "
              f"max difference {worst:g}")
        if not worst <= TOLERANCE:
            faults.append(f"the parameters differ by {worst:g} (> {TOLERANCE:g})")
    for fault in faults:
        print(f"FAIL (rank {dist.get_rank()}): {fault}")
    return 1 if faults else 0


def read_directory(d):
    tensors, groups = {}, None
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(d, name)))
            with safe_open(os.path.join(d, name), "pt") as f:
                groups = f.metadata().get("cpprun_param_groups", groups)
    return tensors, json.loads(groups) if groups else None


def same(a, b):
    (ta, ga), (tb, gb) = read_directory(a), read_directory(b)
    differ = sorted(n for n in set(ta) | set(tb) if n not in ta or n not in tb or not torch.equal(ta[n], tb[n]))
    options = lambda groups: [{k: v for k, v in g.items() if k in ("params", "lr", "betas", "eps", "weight_decay")}
                              for g in groups]
    if differ or options(ga) != options(gb):
        print(f"FAIL: {a} and {b} differ: tensors {differ}, groups {ga} against {gb}")
        return 1
    print(f"{len(ta)} tensors and the param groups bit for bit the same")
    return 0


def forms(d):
    torch.manual_seed(3)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=0.02)
    torch.nn.functional.mse_loss(model(torch.randn(5, 8)), torch.randn(5, 4)).backward()
    optim.step()
    model_sd = get_model_state_dict(model)
    dcp.save({"model": model_sd, "optimizer": get_optimizer_state_dict(model, optim, options=FLAT)},
             checkpoint_id=f"{d}/form_flat_dcp")
    dcp.save({"model": model_sd, "optimizer": get_optimizer_state_dict(model, optim)}, checkpoint_id=f"{d}/form_nested_dcp")
    dcp.save({"model": model_sd, "optimizer": optim.state_dict()}, checkpoint_id=f"{d}/form_by_index_dcp")
    return 0


def main(mode, d, other=None):
    if mode == "init":
        torch.manual_seed(0)
        batches = {}
        for s in range(BEFORE + AFTER):
            batches[f"x{s}"], batches[f"y{s}"] = torch.randn(12, 8, dtype=torch.float64), torch.randn(12, 4, dtype=torch.float64)
        save_file(batches, f"{d}/batches.safetensors")
        save_file({k: v.double() for k, v in Net().state_dict().items()}, f"{d}/init.safetensors")
        return 0
    if mode == "same":
        return same(d, other)
    if mode == "forms":
        return forms(d)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    try:
        # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
        # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
        batches = {k: v.clone() for k, v in load_file(f"{d}/batches.safetensors").items()}
        status = train(d, batches) if mode == "train" else resume(d, batches)
        # Every rank done with its collectives, then no teardown at all: Gloo's teardown aborts
        # ("terminate called without an active exception", SIGABRT) in a rank whose peer tore its
        # side down first, after both had checked their steps. A barrier before
        # destroy_process_group() (12-02) made it rarer, not gone: CI of 12-04 met it in PyTorch's
        # train. PyTorch's own launcher tests meet the same (torchrun's --run_path workers wait for
        # each other before exiting for it). Not on an error's way out, where the other rank may
        # be in another collective.
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
