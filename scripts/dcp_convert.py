#!/usr/bin/env python3
"""A checkpoint of PyTorch's torch.distributed.checkpoint (DCP), as torchtitan writes it, into
cpprun's checkpoint directory, and back. Both ways go through PyTorch's own DCP reader and writer
(dcp.load, dcp.save, with no process group); see docs/checkpoints.md, "From and to PyTorch's
torch.distributed.checkpoint".

  python scripts/dcp_convert.py to-cpprun DCP_DIR OUT_DIR
      DCP_DIR (dcp.save's directory: .metadata, __R_0.distcp) -> OUT_DIR in cpprun's layout:
      model-00001-of-00001.safetensors + model.safetensors.index.json, and the optimizer's
      optimizer-00001-of-00001.safetensors + optimizer.safetensors.index.json, which
      cpprun::load_state_dict(model, "OUT_DIR/") and load_optimizer_state_dict(model, optimizer,
      "OUT_DIR/") load at any world size. What is neither model nor optimizer (torchtitan's
      train_state, lr_scheduler, dataloader) goes to OUT_DIR/dcp_extra.pt, named on stdout.
  python scripts/dcp_convert.py to-dcp CPPRUN_DIR OUT_DIR [--extra dcp_extra.pt]
      cpprun's directory (save_state_dict + save_optimizer_state_dict to one directory) -> a DCP
      checkpoint that dcp.load reads into get_model_state_dict / get_optimizer_state_dict(...,
      StateDictOptions(flatten_optimizer_state_dict=True)) at any world size, FSDP2 included.

Where the model and optimizer sit in the DCP state dict:
  torchtitan (since July 2025): the model's names at the top level, "optimizer" the flattened
    optimizer state dict ("state.<fqn>.exp_avg", "param_groups.<fqn>.lr"), beside "train_state",
    "lr_scheduler", "dataloader". to-dcp writes this by default.
  {"model": ..., "optimizer": ...} (torchtitan before, most hand-written loops): --model-key model.
  to-cpprun finds either by itself; --model-key and --optimizer-key name others (a dotted path:
  "app.model" for {"app": {"model": ...}}).
"""
import argparse
import json
import os
import struct
import sys
import uuid
import warnings
import zlib

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

# cpprun's metadata keys (support/safetensors.h, support/safetensors_index.h, checkpoint/optimizer_state_dict.h).
CRC_KEY = "cpprun_crc32"
SAVE_ID_KEY = "cpprun_save_id"
STEP_KEY = "cpprun_step"
KIND_KEY = "cpprun_optimizer"
GROUPS_KEY = "cpprun_param_groups"
KINDS = ("SGD", "Adam", "AdamW")
# One process, no process group, on purpose: DCP's warning that it assumes so says nothing new.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
EXTRA_FILE = "dcp_extra.pt"


class ConvertError(Exception):
    """A refusal: the message says what was wrong and how to go on."""


# ---- reading DCP ----------------------------------------------------------------------------


def read_dcp(dcp_dir):
    """Every entry of a DCP checkpoint as {path: value}, the path being the keys it had in the
    state dict given to dcp.save (("optimizer", "state.fc1.weight.exp_avg")). Tensors come whole,
    however many ranks wrote them; other values as dcp.load unpickles them."""
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        raise ConvertError(f"{dcp_dir} holds no .metadata: it is not a checkpoint written by "
                           "torch.distributed.checkpoint.save (a torchtitan step-N directory is one)")
    reader = FileSystemReader(dcp_dir)
    metadata = reader.read_metadata()
    # A state dict of the saved keys: an empty tensor of each saved size and dtype for dcp.load to
    # fill, a placeholder where it unpickles an object (what format_utils.dcp_to_torch_save does).
    template = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            template[key] = torch.empty(item.size, dtype=item.properties.dtype)
        else:
            template[key] = None
    dcp.load(template, storage_reader=reader)
    paths = metadata.planner_data or {}
    return {tuple(paths.get(key, (key,))): value for key, value in template.items()}


def key_path(text):
    return tuple(text.split(".")) if text else ()


def find_parts(entries, model_key, optimizer_key):
    """The model's and optimizer's key paths: given, else torchtitan's or {"model": ...}."""
    firsts = {path[0] for path in entries}
    if model_key is None:
        model_key = "model" if "model" in firsts else ""
    if optimizer_key is None:
        optimizer_key = next((k for k in ("optimizer", "optim") if k in firsts), "optimizer")
    return key_path(model_key), key_path(optimizer_key)


def split_entries(entries, model_path, optimizer_path):
    """entries -> (model {name: tensor}, optimizer {flat key: value}, nested param_groups or None,
    the rest {path: value})."""
    model, optimizer, extra = {}, {}, {}
    groups = {}  # not flattened: DCP saved each group's options apart, by the group's index
    for path, value in entries.items():
        if path[:len(optimizer_path)] == optimizer_path and len(path) > len(optimizer_path):
            rest = path[len(optimizer_path):]
            if rest[0] == "state" and len(rest) > 1 and str(rest[1]).isdigit():
                raise ConvertError(f"{'.'.join(map(str, path))}: the optimizer's state is keyed by parameter "
                                   "index (optimizer.state_dict()), not by name: save it with "
                                   "torch.distributed.checkpoint.state_dict.get_optimizer_state_dict(model, optim)")
            if rest[0] == "param_groups" and len(rest) == 3 and isinstance(rest[1], int):  # not flattened
                groups.setdefault(rest[1], {})[rest[2]] = value
            elif rest[0] == "state" and len(rest) == 3:  # ... its "state": {fqn: {"exp_avg": ...}}
                optimizer[f"state.{rest[1]}.{rest[2]}"] = value
            elif len(rest) == 1 and rest[0].startswith(("state.", "param_groups.")):  # flattened
                optimizer[rest[0]] = value
            else:
                raise ConvertError(f"{'.'.join(map(str, path))}: an optimizer entry of neither form "
                                   "get_optimizer_state_dict writes (nested optimizer state, as "
                                   "Shampoo's, is not cpprun's)")
        elif path[:len(model_path)] == model_path and len(path) == len(model_path) + 1 and torch.is_tensor(value):
            model[path[-1]] = value
        else:
            extra[path] = value
    return model, optimizer, [groups[i] for i in sorted(groups)] if groups else None, extra


def plain(value):
    """A param group option as JSON takes it, or None where it cannot."""
    if torch.is_tensor(value) and value.numel() == 1:
        value = value.item()
    if isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return None


def param_groups_of(optimizer, groups):
    """cpprun's param groups ([{"params": [fqn, ...], "lr": ...}, ...]) from the nested form's
    list, else from the flattened "param_groups.<fqn>.<option>": parameters with the same options
    are one group (the flat form records no more), in the order DCP's metadata lists them (the
    order get_optimizer_state_dict flattened them in)."""
    if groups is not None:
        return [{k: plain(v) for k, v in g.items()} for g in groups]
    options = {}  # fqn -> {option: value}
    for key, value in optimizer.items():
        if key.startswith("param_groups."):
            fqn, option = key[len("param_groups."):].rsplit(".", 1)
            options.setdefault(fqn, {})[option] = plain(value)
    out = []
    for fqn in options:
        same = next((g for g in out if {k: v for k, v in g.items() if k != "params"} == options[fqn]), None)
        if same is None:
            out.append({"params": [fqn], **options[fqn]})
        else:
            same["params"].append(fqn)
    return out


def optimizer_kind(state, groups, given):
    """PyTorch's class name of the optimizer, which DCP does not record: SGD holds a momentum
    buffer or options, Adam and AdamW differ by decoupled_weight_decay (torch 2.x's groups hold it)."""
    if given:
        return given
    whats = {key.rsplit(".", 1)[1] for key in state}
    options = groups[0] if groups else {}
    if "momentum_buffer" in whats or "momentum" in options:
        return "SGD"
    if "exp_avg" in whats or "betas" in options:
        if "decoupled_weight_decay" in options:
            return "AdamW" if options["decoupled_weight_decay"] else "Adam"
    raise ConvertError("cannot tell which optimizer wrote this state (its param groups name no "
                       f"decoupled_weight_decay; state {sorted(whats)}): pass --optimizer {'|'.join(KINDS)}")


# ---- writing cpprun's files -----------------------------------------------------------------


def crc_in_name_order(data, header):
    """cpprun's CRC-32 of a safetensors data section: the tensors' bytes in name order, whatever
    order the file holds them in (Note [The CRC is over the tensors in name order])."""
    crc = 0
    for name in sorted(k for k in header if k != "__metadata__"):
        begin, end = header[name]["data_offsets"]
        crc = zlib.crc32(data[begin:end], crc)
    return crc


def encode(tensors, metadata):
    """A safetensors file's bytes with cpprun's CRC-32 of its data in the metadata, so that cpprun
    checks it on load as it checks its own. The reference writer orders tensors by dtype first, so
    the CRC is taken in name order, as cpprun takes it."""
    unstamped = save_safetensors(tensors, metadata=metadata)
    size = struct.unpack("<Q", unstamped[:8])[0]
    data = unstamped[8 + size:]
    crc = crc_in_name_order(data, json.loads(unstamped[8:8 + size]))
    stamped = save_safetensors(tensors, metadata={**metadata, CRC_KEY: f"{crc:08x}"})
    assert stamped.endswith(data)  # the data section does not depend on the metadata
    return stamped


def write_atomically(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def write_cpprun_part(out_dir, stem, tensors, stamp):
    """One shard in Hugging Face's layout (cpprun loads it at any world size) and its index."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    shard = f"{stem}-00001-of-00001.safetensors"
    write_atomically(os.path.join(out_dir, shard), encode(tensors, stamp))
    index = {"metadata": {**stamp, "total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {name: shard for name in sorted(tensors)}}
    write_atomically(os.path.join(out_dir, f"{stem}.safetensors.index.json"),
                     json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")


def check_fresh(path):
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ConvertError(f"{path} exists and is not an empty directory: name a new one")


def nest(entries):
    """{path: value} -> the nested dict it came from."""
    out = {}
    for path, value in entries.items():
        at = out
        for key in path[:-1]:
            at = at.setdefault(key, {})
        at[path[-1]] = value
    return out


def to_cpprun(args):
    check_fresh(args.out_dir)
    entries = read_dcp(args.dcp_dir)
    model_path, optimizer_path = find_parts(entries, args.model_key, args.optimizer_key)
    model, optimizer, nested_groups, extra = split_entries(entries, model_path, optimizer_path)
    if not model:
        raise ConvertError(f"{args.dcp_dir} holds no model tensors under "
                           f"{'.'.join(model_path) or 'the top level'}: name where they are with --model-key")
    names = list(model)
    os.makedirs(args.out_dir, exist_ok=True)
    step = extra.get(("train_state", "step"))
    stamp = {"format": "pt", SAVE_ID_KEY: uuid.uuid4().hex}
    if isinstance(step, int) or (torch.is_tensor(step) and step.numel() == 1):
        stamp[STEP_KEY] = str(int(step))
    write_cpprun_part(args.out_dir, "model", model, stamp)
    print(f"model: {len(model)} tensors -> {args.out_dir}/model-00001-of-00001.safetensors")

    state = {}
    for key, value in optimizer.items():
        if not key.startswith("state.") or value is None:  # SGD without momentum keeps None
            continue
        fqn = key[len("state."):].rsplit(".", 1)[0]
        if fqn not in model:
            raise ConvertError(f"the optimizer's {key} names no tensor of the model "
                               f"({len(names)}, e.g. {names[0]}): is --model-key right?")
        state[key] = value if torch.is_tensor(value) else torch.tensor(float(value), dtype=torch.float32)
    groups = param_groups_of(optimizer, nested_groups)
    if state or groups:
        kind = optimizer_kind(state, groups, args.optimizer)
        metadata = {**stamp, KIND_KEY: kind, GROUPS_KEY: json.dumps(groups)}
        write_cpprun_part(args.out_dir, "optimizer", state, metadata)
        print(f"optimizer: {kind}, {len(state)} state tensors, {len(groups)} param group(s) "
              f"-> {args.out_dir}/optimizer-00001-of-00001.safetensors")
    else:
        print(f"optimizer: none under {'.'.join(optimizer_path)} (a model-only checkpoint)")
    if extra or groups:
        # Kept for to-dcp --extra, with the param groups' options as DCP held them: cpprun's next
        # save writes its own options only, not initial_lr, foreach, ...
        torch.save({"entries": nest(extra), "param_groups": groups}, os.path.join(args.out_dir, EXTRA_FILE))
        if groups:
            print(f"the param groups' options, all of them, kept in {EXTRA_FILE} too")
        for path, value in extra.items():
            shown = tuple(value.shape) if torch.is_tensor(value) else repr(value)[:60]
            print(f"not model or optimizer, kept in {EXTRA_FILE}: {'.'.join(path)} = {shown}")
    return 0


# ---- reading cpprun's files -----------------------------------------------------------------


def read_checked(path):
    """A safetensors file's tensors and metadata; cpprun's CRC checked where it wrote one."""
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    metadata = header.get("__metadata__", {})
    crc = metadata.get(CRC_KEY)
    body = data[8 + size:]
    # In name order (cpprun's), or the file's (what this script stamped before it used name order).
    if crc is not None and crc not in (f"{crc_in_name_order(body, header):08x}", f"{zlib.crc32(body):08x}"):
        raise ConvertError(f"{path} is damaged: the CRC-32 of its data is not the {crc} recorded when it was written")
    return load_safetensors(data), metadata


def read_cpprun_part(directory, stem):
    """({name: tensor}, first file's metadata, [save ids seen]) of STEM's files in DIRECTORY, by
    the index or the single file; None when it holds neither."""
    index_path = os.path.join(directory, f"{stem}.safetensors.index.json")
    single = os.path.join(directory, f"{stem}.safetensors")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        ids = [index.get("metadata", {}).get(SAVE_ID_KEY)]
    elif os.path.isfile(single):
        files, ids = [os.path.basename(single)], []
    else:
        return None
    tensors, first = {}, None
    for name in files:
        part, metadata = read_checked(os.path.join(directory, name))
        tensors.update(part)
        first = metadata if first is None else first
        ids.append(metadata.get(SAVE_ID_KEY))
    if first is None:  # an index of no files (an optimizer saved before its first step): its stamp
        first = {k: v for k, v in index.get("metadata", {}).items() if k != "total_size"}
    if os.path.isfile(index_path) and set(tensors) != set(index["weight_map"]):
        raise ConvertError(f"{index_path} and its files disagree on the tensors: a shard from another save?")
    return tensors, first, ids


def torch_default_group(kind):
    """Every option a torch.optim.KIND param group holds, at PyTorch's defaults: what
    set_optimizer_state_dict and dcp.load expect under param_groups.<fqn>.*."""
    optimizer = getattr(torch.optim, kind)([torch.nn.Parameter(torch.zeros(1))])
    return {k: v for k, v in optimizer.param_groups[0].items() if k not in ("params", "param_names")}


def to_dcp(args):
    check_fresh(args.out_dir)
    model_part = read_cpprun_part(args.cpprun_dir, "model")
    if model_part is None:
        raise ConvertError(f"{args.cpprun_dir} holds neither model.safetensors.index.json nor "
                           "model.safetensors: is it the directory cpprun::save_state_dict wrote?")
    model, model_metadata, ids = model_part
    optimizer_part = read_cpprun_part(args.cpprun_dir, "optimizer")
    if optimizer_part is not None:
        ids += optimizer_part[2]
    if len({i for i in ids if i is not None}) > 1:
        raise ConvertError(f"the files in {args.cpprun_dir} are from different saves (save ids "
                           f"{sorted({i for i in ids if i is not None})}): convert one save's files")
    extra = {"entries": {}, "param_groups": []}
    if args.extra:
        extra = torch.load(args.extra, weights_only=False)  # to-cpprun's own file; DCP unpickles so too
    state = dict(extra["entries"])
    if optimizer_part is not None:  # the model's order (cpprun's param groups keep it), not the files' (by name)
        order = [fqn for group in json.loads(optimizer_part[1].get(GROUPS_KEY, "[]")) for fqn in group["params"]]
        model = {**{n: model[n] for n in order if n in model}, **model}
    if args.model_key:
        state[args.model_key] = model
    else:
        clash = sorted(set(model) & set(state))
        if clash:
            raise ConvertError(f"model tensors {clash} have the names of other entries: pass --model-key model")
        state.update(model)
    print(f"model: {len(model)} tensors")
    if optimizer_part is not None:
        tensors, metadata, _ = optimizer_part
        kind = metadata.get(KIND_KEY)
        if kind not in KINDS:
            raise ConvertError(f"{args.cpprun_dir}'s optimizer files name the optimizer {kind!r}, not one of {KINDS}")
        # Each parameter's options: PyTorch's defaults, then what the DCP checkpoint had (to-cpprun's
        # dcp_extra.pt), then cpprun's own.
        before = {fqn: g for g in extra["param_groups"] for fqn in g["params"]}
        flat = dict(tensors)
        groups = json.loads(metadata.get(GROUPS_KEY, "[]"))
        for group in groups:
            for fqn in group["params"]:
                options = {**torch_default_group(kind), **before.get(fqn, {}), **group}
                for option, value in options.items():
                    if option != "params":
                        flat[f"param_groups.{fqn}.{option}"] = tuple(value) if option == "betas" else value
        state["optimizer"] = flat
        print(f"optimizer: {kind}, {len(tensors)} state tensors, {len(groups)} param group(s)")
    dcp.save(state, checkpoint_id=args.out_dir)
    for key in extra["entries"]:
        print(f"from {args.extra}: {key}")
    print(f"-> {args.out_dir} (torch.distributed.checkpoint)")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See docs/checkpoints.md, \"From and to PyTorch's torch.distributed.checkpoint\".")
    commands = parser.add_subparsers(dest="command", required=True)
    into = commands.add_parser("to-cpprun", help="a DCP checkpoint -> cpprun's directory")
    into.add_argument("dcp_dir")
    into.add_argument("out_dir")
    into.add_argument("--model-key", help="the model's entry, as a dotted path (default: \"model\" if "
                      "there is one, else the tensors at the top level, as torchtitan saves them)")
    into.add_argument("--optimizer-key", help="the optimizer's entry (default: optimizer, else optim)")
    into.add_argument("--optimizer", choices=KINDS, help="the optimizer's class, where the state does not tell")
    back = commands.add_parser("to-dcp", help="cpprun's directory -> a DCP checkpoint")
    back.add_argument("cpprun_dir")
    back.add_argument("out_dir")
    back.add_argument("--model-key", default="", help="put the model under this key (default: at "
                      "the top level, as torchtitan; \"model\" for {\"model\": ..., \"optimizer\": ...})")
    back.add_argument("--extra", help=f"a {EXTRA_FILE} that to-cpprun wrote: its entries "
                      "(train_state, lr_scheduler, ...) and param-group options go back in")
    args = parser.parse_args(argv)
    try:
        return to_cpprun(args) if args.command == "to-cpprun" else to_dcp(args)
    except ConvertError as e:
        print(f"dcp_convert {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
