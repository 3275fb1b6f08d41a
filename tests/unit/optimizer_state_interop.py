"""The Python side of optimizer_state_interop.sh: an AdamW state saved by cpprun
(cpprun/optimizer_state_dict.h) loads into torch.optim.AdamW through PyTorch's own
set_optimizer_state_dict(..., StateDictOptions(full_state_dict=True,
flatten_optimizer_state_dict=True)) and its next step matches cpprun's; PyTorch's state, written in
the same form, is what cpprun resumes from.

  optimizer_state_interop.py init DIR     DIR/batches.safetensors, DIR/init.safetensors
  optimizer_state_interop.py load DIR     loads DIR/ckpt/, steps on batch 3, compares with DIR/cpp_next.safetensors
  optimizer_state_interop.py write DIR    trains 3 steps from init, writes DIR/py/, steps, DIR/py_next.safetensors
  optimizer_state_interop.py inmem DIR    trains 3 steps from init; PyTorch's get_optimizer_state_dict against
                                          cpprun's (DIR/inmem.pt): the same keys and values
  optimizer_state_interop.py tied DIR     DIR/tied/ (cpprun's save of a model whose head.weight is emb.weight):
                                          the state's names are PyTorch's own, and it steps to DIR/tied_next.safetensors
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 13)
        self.fc2 = torch.nn.Linear(13, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class TiedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(6, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.mid(self.emb(ids)))


def tied(d):
    """A tied parameter's state: cpprun names it as get_optimizer_state_dict does (its first name
    only), set_optimizer_state_dict takes cpprun's file, and the next step matches cpprun's."""
    ids = torch.tensor([1, 2, 5, 0])
    model = TiedNet()
    model.load_state_dict(load_file(f"{d}/tied/model.safetensors"))
    probe = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(ids).square().mean().backward()
    probe.step()
    ours = {k for k in get_optimizer_state_dict(model, probe, options=FLAT) if k.startswith("state.")}
    theirs = set(load_file(f"{d}/tied/optimizer.safetensors"))
    if ours != theirs:
        print(f"names differ: PyTorch {sorted(ours)}, cpprun {sorted(theirs)}")
        return 1
    model = TiedNet()
    model.load_state_dict(load_file(f"{d}/tied/model.safetensors"))
    optim = torch.optim.AdamW(model.parameters(), lr=0.5)
    load_cpprun_optimizer(model, optim, f"{d}/tied/optimizer.safetensors")
    optim.zero_grad()
    model(ids).square().mean().backward()
    optim.step()
    w = worst(model, f"{d}/tied_next.safetensors")
    print(f"tied: the names match PyTorch's ({len(theirs)} tensors); PyTorch's step from cpprun's state: max difference {w:g}")
    return 0 if w <= 1e-6 else 1


# full_state_dict=True as well fails in PyTorch 2.15 on an unsharded model, even with the dict its own
# get_optimizer_state_dict made (KeyError 'param_groups.0.params.0'); the state of an unsharded
# model is the full state anyway.
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def load_cpprun_optimizer(model, optim, path):
    """The docs' snippet (docs/checkpoints.md): a cpprun optimizer save (a directory or a
    .safetensors file) into a PyTorch optimizer, by parameter name."""
    if os.path.isdir(path):
        index = json.load(open(os.path.join(path, "optimizer.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
    else:
        path, files = os.path.dirname(path), [os.path.basename(path)]
    flat = {}
    for name in files:
        flat.update(load_file(os.path.join(path, name)))
        with safe_open(os.path.join(path, name), "pt") as f:
            groups = json.loads(f.metadata()["cpprun_param_groups"])
    for saved, group in zip(groups, optim.param_groups):
        for fqn in saved["params"]:
            for key, value in {**group, **saved}.items():  # options cpprun lacks keep PyTorch's
                if key != "params":
                    flat[f"param_groups.{fqn}.{key}"] = tuple(value) if key == "betas" else value
    set_optimizer_state_dict(model, optim, flat, options=FLAT)


def same_value(ours, theirs):
    """A value of get_optimizer_state_dict's flattened dict, cpprun's against PyTorch's: tensors of
    one dtype and shape (1e-6: two implementations' float32 steps), bools as bools, numbers by value
    (PyTorch keeps some as ints: weight_decay=0), None, tuples item by item."""
    if isinstance(theirs, torch.Tensor):
        return (isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
                and (ours - theirs).abs().max().item() <= 1e-6)
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return type(ours) is bool and type(theirs) is bool and ours == theirs
    if isinstance(theirs, tuple):
        return isinstance(ours, tuple) and len(ours) == len(theirs) and all(map(same_value, ours, theirs))
    if theirs is None or ours is None:
        return ours is None and theirs is None
    return isinstance(ours, (int, float)) and float(ours) == float(theirs)


def inmem(d, batches):
    """cpprun's get_optimizer_state_dict against PyTorch's, after the same three AdamW steps."""
    model = Net()
    model.load_state_dict(load_file(f"{d}/init.safetensors"))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    for s in range(3):
        step(model, optim, batches, s)
    theirs = get_optimizer_state_dict(model, optim, options=FLAT)
    ours = torch.load(f"{d}/inmem.pt", weights_only=False)
    if set(ours) != set(theirs):
        print(f"keys differ: cpprun only {sorted(set(ours) - set(theirs))}, PyTorch only {sorted(set(theirs) - set(ours))}")
        return 1
    differ = [k for k in theirs if not same_value(ours[k], theirs[k])]
    for k in differ:
        print(f"{k}: cpprun {ours[k]!r}, PyTorch {theirs[k]!r}")
    print(f"get_optimizer_state_dict: {len(theirs)} keys, the same as PyTorch's; {len(differ)} value(s) differ")
    return 1 if differ else 0


def step(model, optim, batches, s):
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(batches[f"x{s}"]), batches[f"y{s}"]).backward()
    optim.step()


def worst(model, path):
    expected = load_file(path)
    return max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())


def main(mode, d):
    if mode == "init":
        torch.manual_seed(0)
        batches = {}
        for s in range(4):
            batches[f"x{s}"], batches[f"y{s}"] = torch.randn(12, 8), torch.randn(12, 4)
        save_file(batches, f"{d}/batches.safetensors")
        save_file(Net().state_dict(), f"{d}/init.safetensors")
        return 0
    if mode == "tied":
        return tied(d)
    batches = load_file(f"{d}/batches.safetensors")
    if mode == "inmem":
        return inmem(d, batches)
    model = Net()
    if mode == "load":
        model.load_state_dict(load_file(f"{d}/ckpt/model-00001-of-00001.safetensors"))
        optim = torch.optim.AdamW(model.parameters(), lr=0.5)  # the file's lr (0.01) must win
        load_cpprun_optimizer(model, optim, f"{d}/ckpt/")
        assert optim.param_groups[0]["lr"] == 0.01 and optim.param_groups[0]["weight_decay"] == 0.05
        step(model, optim, batches, 3)
        w = worst(model, f"{d}/cpp_next.safetensors")
        print(f"PyTorch's step from cpprun's AdamW state: max difference {w:g}")
        return 0 if w <= 1e-6 else 1
    model.load_state_dict(load_file(f"{d}/init.safetensors"))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    for s in range(3):
        step(model, optim, batches, s)
    flat = get_optimizer_state_dict(model, optim, options=FLAT)
    tensors = {k: v.contiguous() for k, v in flat.items() if k.startswith("state.")}
    groups = [{"params": [n for n, p in model.named_parameters()],
               **{k: v for k, v in optim.param_groups[0].items() if k != "params"}}]
    os.makedirs(f"{d}/py", exist_ok=True)
    save_file(tensors, f"{d}/py/optimizer.safetensors",
              metadata={"cpprun_optimizer": "AdamW", "cpprun_param_groups": json.dumps(groups)})
    save_file(model.state_dict(), f"{d}/py/model.safetensors")
    step(model, optim, batches, 3)
    save_file(model.state_dict(), f"{d}/py_next.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
