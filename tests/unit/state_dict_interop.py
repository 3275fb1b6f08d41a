"""The Python side of state_dict_interop.sh, with PyTorch's and safetensors' own readers.

  state_dict_interop.py check DIR   DIR/cpp.pt and DIR/cpp.safetensors (cpprun's) load with defaults
                                    (torch.load, safetensors.torch.load_file) into Net, equal to the reference
  state_dict_interop.py write DIR   DIR/py.pt (torch.save(model.state_dict())), DIR/py.safetensors
                                    (safetensors.torch.save_file), and DIR/py_other.pt: a Net of other shapes
"""
import sys
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import nn


class Net(nn.Module):
    """state_dict_interop.cpp's Net: an embedding, a small body, a head tied to the embedding."""

    def __init__(self, hidden=3):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.body = nn.Sequential(nn.Linear(4, hidden), nn.BatchNorm1d(hidden))
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight
        # Other dtypes and shapes: a 0-d, an empty, bf16, float64, int32, bool.
        self.register_buffer("scalar", torch.zeros(()))
        self.register_buffer("empty", torch.zeros(0, 4))
        self.register_buffer("bf16", torch.zeros(2, 3, dtype=torch.bfloat16))
        self.register_buffer("f64", torch.zeros(3, dtype=torch.float64))
        self.register_buffer("i32", torch.zeros(4, dtype=torch.int32))
        self.register_buffer("flags", torch.zeros(3, dtype=torch.bool))


def reference(model):
    """The k-th name in sorted order holds arange(numel) * 0.25 + k (integers: arange(numel) + k);
    the tied head holds the embedding's values."""
    state = model.state_dict()
    values = {}
    for k, name in enumerate(sorted(state)):
        t = state[name]
        base = torch.arange(t.numel(), dtype=torch.float64)
        if t.is_floating_point():
            base = base * 0.25
        values[name] = (base + k).reshape(t.shape).to(t.dtype)
    values["head.weight"] = values["embed.weight"]
    return values


def same(a, b, what):
    assert set(a) == set(b), f"{what}: names {sorted(a)} != {sorted(b)}"
    for name in a:
        assert a[name].dtype == b[name].dtype, f"{what}: {name} is {a[name].dtype}, not {b[name].dtype}"
        assert torch.equal(a[name], b[name]), f"{what}: {name} differs"


def check(directory):
    model = Net()
    expected = reference(model)
    loaded = torch.load(directory / "cpp.pt")  # PyTorch's default: weights_only=True
    assert isinstance(loaded, dict), f"torch.load gave a {type(loaded)}"
    same(loaded, expected, "cpp.pt")
    # The tied pair is one storage, as torch.save writes it.
    assert loaded["embed.weight"].data_ptr() == loaded["head.weight"].data_ptr(), "cpp.pt: the tied pair is two copies"
    model.load_state_dict(loaded)  # strict
    same(model.state_dict(), expected, "cpp.pt in Net")
    tensors = safetensors.torch.load_file(directory / "cpp.safetensors")
    same(tensors, expected, "cpp.safetensors")
    Net().load_state_dict(tensors)
    with safetensors.safe_open(directory / "cpp.safetensors", framework="pt") as f:
        metadata = f.metadata()
    assert metadata.get("format") == "pt" and len(metadata.get("cpprun_crc32", "")) == 8, metadata
    print(f"PASS: torch.load and safetensors.torch.load_file read cpprun's files ({len(expected)} tensors)")


def write(directory):
    model = Net()
    with torch.no_grad():
        for name, value in reference(model).items():
            model.state_dict()[name].copy_(value)
    torch.save(model.state_dict(), directory / "py.pt")
    # save_file refuses tensors that share memory: the tied pair as two copies, as save_model would.
    safetensors.torch.save_file({k: v.clone() for k, v in model.state_dict().items()}, directory / "py.safetensors")
    torch.save(Net(hidden=6).state_dict(), directory / "py_other.pt")
    print("wrote py.pt, py.safetensors, py_other.pt")


if __name__ == "__main__":
    {"check": check, "write": write}[sys.argv[1]](Path(sys.argv[2]))
