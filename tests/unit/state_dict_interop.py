"""The Python side of state_dict_interop.sh, with PyTorch's and safetensors' own readers.

  state_dict_interop.py check DIR   DIR/cpp.pt and DIR/cpp.safetensors (cpprun's) load with defaults
                                    (torch.load, safetensors.torch.load_file) into Net, equal to the reference;
                                    cpp.pt and DIR/cpp_order.txt (get_model_state_dict's) list state_dict()'s order
  state_dict_interop.py write DIR   DIR/py.pt (torch.save(model.state_dict())), DIR/py.safetensors
                                    (safetensors.torch.save_file), and DIR/py_other.pt: a Net of other shapes;
                                    their copies checkpoint.pth.tar and model.ckpt; py_ddp.pt (a DDP state dict:
                                    "module." names), py_checkpoint.pth.tar ({"model": ..., "epoch": 3, ...}),
                                    py_whole.pt (torch.save(model)), py_dcp/ (dcp.save's directory)
  state_dict_interop.py check_sharded DIR N   DIR (cpprun's Hugging Face sharded save on N ranks) reads as one
                                    model: safetensors.torch.load_file per file + the index; transformers'
                                    load_sharded_checkpoint too when transformers is installed
  state_dict_interop.py write_sharded DIR     DIR/py_sharded/ in Hugging Face's layout (3 files + index), and
                                    DIR/py_sharded_lacking/: its index places a tensor in a file without it
  state_dict_interop.py write_dtypes DIR      DIR/py_dtypes.pt and .safetensors (the newer dtypes; in the .pt a
                                    lazily negated and a conjugated view too), each with FILE.expected: the
                                    lines state_dict_interop's dump must print; DIR/py_legacy.pt (torch.save's
                                    pre-1.6 format); DIR/bin/pytorch_model.bin (transformers' older name) and
                                    DIR/bin_sharded/pytorch_model.bin.index.json
  state_dict_interop.py check_dtypes DIR      DIR/cpp_dtypes.pt and .safetensors hold the pattern, bit for bit
"""
import json
import shutil
import sys
import warnings
import zlib
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
    # Python's state_dict() order: module by module, each one's parameters, then its buffers, then
    # its children (the top-level buffers first, body.1's running stats before head.weight).
    order = list(model.state_dict())
    assert list(loaded) == order, f"cpp.pt lists {list(loaded)}, PyTorch's state_dict() {order}"
    listed = (directory / "cpp_order.txt").read_text().split()
    assert listed == order, f"get_model_state_dict lists {listed}, PyTorch's state_dict() {order}"
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
    # What a PyTorch user's first checkpoints are, beside a plain state dict: torch.save takes any
    # name (ImageNet's example: checkpoint.pth.tar; Lightning: .ckpt), DDP's state dict names every
    # tensor "module.", a training loop saves a dict holding the state dict, or the whole model; and
    # torch.distributed.checkpoint writes a directory.
    shutil.copy(directory / "py.pt", directory / "checkpoint.pth.tar")
    shutil.copy(directory / "py.safetensors", directory / "model.ckpt")
    ddp = nn.Module()
    ddp.module = model  # DDP holds the model as its child "module"
    torch.save(ddp.state_dict(), directory / "py_ddp.pt")
    torch.save({"model": model.state_dict(), "epoch": 3, "best_acc1": 0.5}, directory / "py_checkpoint.pth.tar")
    torch.save(model, directory / "py_whole.pt")
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ...": one process, as the docs run it
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(directory / "py_dcp"))
    assert (directory / "py_dcp" / ".metadata").exists() and list((directory / "py_dcp").glob("*.distcp"))
    print("wrote py.pt, py.safetensors, py_other.pt, checkpoint.pth.tar, model.ckpt, py_ddp.pt, "
          "py_checkpoint.pth.tar, py_whole.pt, py_dcp/")


# The dtypes torch.save writes with _rebuild_tensor_v3 (no legacy storage class), and the complex
# ones; all but complex128 also have safetensors names. As state_dict_interop.cpp's kNewerDtypes.
DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
          "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2fnuz": torch.float8_e5m2fnuz,
          "complex64": torch.complex64, "float8_e8m0fnu": torch.float8_e8m0fnu, "complex128": torch.complex128}
SAFETENSORS_NAMED = list(DTYPES)[:9]
C10_NAMES = {torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
             torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2",
             torch.float8_e4m3fnuz: "Float8_e4m3fnuz", torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
             torch.float8_e8m0fnu: "Float8_e8m0fnu", torch.complex64: "ComplexFloat",
             torch.complex128: "ComplexDouble", torch.float32: "Float"}


def pattern(dtype):
    """Bytes 0, 1, 2, ... (mod 251) as a [2, 3] tensor of dtype, as the C++ side makes it."""
    size = torch.empty((), dtype=dtype).element_size()
    return torch.arange(6 * size).remainder(251).to(torch.uint8).view(dtype).reshape(2, 3)


def raw(t):
    """A tensor's values as bytes (a lazy negation or conjugation applied), NaN patterns compared too."""
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write_dtypes(directory):
    tensors = {name: pattern(dtype) for name, dtype in DTYPES.items()}
    def z():
        return torch.complex(torch.arange(6.0), torch.arange(6.0) + 10).reshape(2, 3)
    # Saved as metadata {'neg': True} / {'conj': True} over the stored values (two storages: torch.save
    # refuses one storage viewed as two dtypes).
    with_views = {**tensors, "neg": z().conj().imag, "conj": z().conj()}
    assert with_views["neg"].is_neg() and with_views["conj"].is_conj()
    torch.save(with_views, directory / "py_dtypes.pt")
    safetensors.torch.save_file({k: tensors[k] for k in SAFETENSORS_NAMED}, directory / "py_dtypes.safetensors")
    for file, held in (("py_dtypes.pt", with_views), ("py_dtypes.safetensors", SAFETENSORS_NAMED)):
        lines = []
        for name in held:
            t = with_views[name]
            shape = "x".join(str(d) for d in t.shape)
            lines.append(f"{name} {C10_NAMES[t.dtype]} {shape} {zlib.crc32(raw(t))}\n")
        (directory / (file + ".expected")).write_text("".join(lines))
    model = Net()
    torch.save(model.state_dict(), directory / "py_legacy.pt", _use_new_zipfile_serialization=False)
    # The same with another pickle protocol: once refused as a damaged zip, not by its format's name.
    for protocol in (0, 4):
        torch.save(model.state_dict(), directory / f"py_legacy_protocol{protocol}.ckpt",
                   _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    (directory / "bin").mkdir()
    shutil.copy(directory / "py.pt", directory / "bin" / "pytorch_model.bin")
    (directory / "bin_sharded").mkdir()
    (directory / "bin_sharded" / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": {}}))
    print("wrote py_dtypes.pt, py_dtypes.safetensors, py_legacy.pt, bin/, bin_sharded/")


def check_dtypes(directory):
    loaded = torch.load(directory / "cpp_dtypes.pt")  # weights_only=True
    assert list(loaded) == list(DTYPES) + ["conj_view"], f"cpp_dtypes.pt holds {list(loaded)}"
    conj_view = loaded.pop("conj_view")
    assert raw(conj_view) == raw(pattern(torch.complex64).conj()), "cpp_dtypes.pt: conj_view is not conjugated"
    for file, tensors in (("cpp_dtypes.pt", loaded),
                          ("cpp_dtypes.safetensors", safetensors.torch.load_file(directory / "cpp_dtypes.safetensors"))):
        names = list(DTYPES) if file.endswith(".pt") else SAFETENSORS_NAMED
        assert sorted(tensors) == sorted(names), f"{file} holds {sorted(tensors)}"
        for name in names:
            t = tensors[name]
            assert t.dtype == DTYPES[name] and t.shape == (2, 3), f"{file}: {name} is {t.dtype} {tuple(t.shape)}"
            assert raw(t) == raw(pattern(DTYPES[name])), f"{file}: {name}'s bytes differ"
    print(f"PASS: torch.load and safetensors read cpprun's {len(DTYPES)} newer dtypes bit for bit")


def shard_name(part, parts):
    return f"model-{part:05d}-of-{parts:05d}.safetensors"


def check_sharded(directory, ranks):
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    files = sorted(set(weight_map.values()))
    # One file per rank (the model has more tensors than ranks), named as transformers names them.
    assert files == [shard_name(i + 1, ranks) for i in range(ranks)], files
    tensors, save_ids = {}, set()
    for file in files:
        part = safetensors.torch.load_file(directory / file)
        assert set(part) == {k for k, v in weight_map.items() if v == file}, f"{file} holds {sorted(part)}"
        assert not set(part) & set(tensors), f"{file} repeats {sorted(set(part) & set(tensors))}"
        tensors.update(part)
        with safetensors.safe_open(directory / file, framework="pt") as f:
            metadata = f.metadata()
        assert metadata["format"] == "pt" and metadata["cpprun_step"] == "17", metadata
        save_ids.add(metadata["cpprun_save_id"])
    assert save_ids == {index["metadata"]["cpprun_save_id"]}, f"save ids {save_ids}, index {index['metadata']}"
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert index["metadata"]["total_size"] == total, f"total_size {index['metadata']['total_size']} != {total}"
    model = Net()
    expected = reference(model)
    same(tensors, expected, "the sharded directory")
    model.load_state_dict(tensors)  # strict
    same(model.state_dict(), expected, "the sharded directory in Net")
    print(f"PASS: safetensors reads cpprun's {ranks}-rank sharded directory as one model ({len(tensors)} tensors)")
    try:
        import transformers
    except ImportError:
        # A partial skip is a skip: exit 77, which the calling test reports as skipped (and
        # scripts/test.sh refuses), never a pass with half the checks missing.
        print("SKIP: transformers is not installed: its sharded-checkpoint reader was not tried")
        sys.exit(77)
    model = Net()
    try:  # transformers 4
        from transformers.modeling_utils import load_sharded_checkpoint
    except ImportError:  # transformers 5 dropped it: the reader from_pretrained itself uses
        from transformers.modeling_utils import load_state_dict
        from transformers.utils.hub import get_checkpoint_shard_files
        files, _ = get_checkpoint_shard_files(str(directory), str(directory / "model.safetensors.index.json"),
                                              local_files_only=True)
        state = {}
        for file in files:
            state.update(load_state_dict(file))
        model.load_state_dict(state)  # strict
        reader = "get_checkpoint_shard_files + load_state_dict"
    else:
        load_sharded_checkpoint(model, directory, strict=True, prefer_safe=True)
        reader = "load_sharded_checkpoint"
    same(model.state_dict(), expected, f"transformers {transformers.__version__}'s {reader}")
    print(f"PASS: transformers {transformers.__version__}'s {reader} reads it")


def write_sharded(directory):
    model = Net()
    with torch.no_grad():
        for name, value in reference(model).items():
            model.state_dict()[name].copy_(value)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # save_file refuses shared storage
    names = list(state)
    parts = 3
    weight_map = {name: shard_name(i * parts // len(names) + 1, parts) for i, name in enumerate(names)}
    for target, index_map in (("py_sharded", weight_map),
                              ("py_sharded_lacking", {**weight_map, "body.0.weight": shard_name(3, parts)})):
        out = directory / target
        out.mkdir()
        for part in range(1, parts + 1):
            file = shard_name(part, parts)
            safetensors.torch.save_file({k: state[k] for k in names if weight_map[k] == file}, out / file,
                                        metadata={"format": "pt"})
        total = sum(t.numel() * t.element_size() for t in state.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": index_map}, indent=2, sort_keys=True))
    assert weight_map["body.0.weight"] != shard_name(3, parts)
    print("wrote py_sharded/ and py_sharded_lacking/")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "check_sharded":
        check_sharded(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        {"check": check, "write": write, "write_sharded": write_sharded, "write_dtypes": write_dtypes,
         "check_dtypes": check_dtypes}[command](Path(sys.argv[2]))
