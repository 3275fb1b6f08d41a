"""transformers' side of tests/examples/gpt2_interop.sh: a small random GPT-2 built from a config
(nothing downloaded), its logits compared with the ones train_gpt wrote, and directories that
train_gpt must refuse.

  gpt2_interop.py make LAYOUT=DIR...     the same random GPT2LMHeadModel, save_pretrained(DIR) in each LAYOUT:
                                         single (one file), sharded (several files + index), base (its GPT2Model
                                         alone, names without "transformer.", as the Hub's gpt2)
  gpt2_interop.py compare CHECK...       each CHECK is four words, same|differs DIR IDS FILE: from_pretrained(DIR)'s
                                         logits for IDS equal FILE's within 1e-5 (same) or do not (differs); every
                                         check runs and each failure is named, exit 1 if any failed
  gpt2_interop.py faults DIR             DIR/<case> for each fault: a config option train_gpt lacks, a missing tensor

One process does all of a command's work: importing transformers costs seconds, and the test
would otherwise pay it once per directory.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

TOLERANCE = 1e-5


def config():
    # vocab 128 covers the default --text's characters (train_gpt encodes one character per token).
    # Weights 10x GPT-2's 0.02: at 0.02 the activations are so small that the exact and the tanh
    # GELU give logits within 1.2e-6, below the tolerance; at 0.2 they differ by 1e-3.
    return GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32, initializer_range=0.2,
                      bos_token_id=None, eos_token_id=None)


def make(out, shard, base=False):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config()).eval()
    # GPT-2's initialisation leaves biases at 0 and LayerNorms at 1: randomise them so that a
    # bias or norm loaded into the wrong place shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    (model.transformer if base else model).save_pretrained(out, max_shard_size="50KB" if shard else "5GB")
    files = sorted(os.listdir(out))
    if shard:
        assert "model.safetensors.index.json" in files, files
    if base:
        names = load_file(os.path.join(out, "model.safetensors")).keys()
        assert "wte.weight" in names and not any(n.startswith("transformer.") for n in names), sorted(names)
    print(f"saved a random GPT-2 to {out}: {files}")


def logits_match(model_dir, ids, path):
    """Whether FILE's logits equal from_pretrained(DIR)'s for IDS within TOLERANCE; None (after
    saying why) where they cannot be compared at all."""
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    tokens = torch.tensor([[int(i) for i in ids.split(",")]])
    with torch.no_grad():
        expected = model(tokens).logits[0].double().numpy()
    got = np.loadtxt(path, ndmin=2)
    if got.shape != expected.shape:
        print(f"{path} holds logits of shape {got.shape}, transformers gives {expected.shape} for {model_dir}")
        return None
    diff = float(np.abs(got - expected).max())
    print(f"{path} against {model_dir}: max |train_gpt - transformers| over {expected.size} logits: {diff:.3g} "
          f"(scale {np.abs(expected).max():.3g}, tolerance {TOLERANCE})")
    return diff <= TOLERANCE


def compare(words):
    if not words or len(words) % 4:
        sys.exit(f"compare takes checks of four words (same|differs DIR IDS FILE), got {words}")
    failures = []
    for i in range(0, len(words), 4):
        expect, model_dir, ids, path = words[i:i + 4]
        if expect not in ("same", "differs"):
            sys.exit(f"compare: a check starts with same or differs, not {expect!r}")
        match = logits_match(model_dir, ids, path)
        if match is None or match != (expect == "same"):
            failures.append(f"{path}: train_gpt's logits should {'equal' if expect == 'same' else 'differ from'} "
                            f"transformers' for {model_dir}")
    for failure in failures:
        print(f"FAIL: {failure}")
    sys.exit(1 if failures else 0)


def faults(out):
    make(os.path.join(out, "good"), shard=False)
    good = os.path.join(out, "good")

    def variant(name, edit_config=None, drop=None):
        d = os.path.join(out, name)
        os.makedirs(d)
        with open(os.path.join(good, "config.json")) as f:
            cfg = json.load(f)
        if edit_config:
            edit_config(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        tensors = load_file(os.path.join(good, "model.safetensors"))
        if drop:
            del tensors[drop]
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    variant("inverse_layer_idx", lambda c: c.update(scale_attn_by_inverse_layer_idx=True))
    variant("relu", lambda c: c.update(activation_function="relu"))
    variant("not_gpt2", lambda c: c.update(model_type="llama"))
    variant("missing_tensor", drop="transformer.h.1.mlp.c_fc.weight")
    # A float16 model, as GPT2LMHeadModel(...).half().save_pretrained writes it (config.json's dtype).
    half = os.path.join(out, "fp16")
    GPT2LMHeadModel.from_pretrained(good).half().save_pretrained(half)
    # transformers' older layout (safe_serialization=False): pytorch_model.bin, a torch.save file.
    bin_dir = os.path.join(out, "bin")
    os.makedirs(bin_dir)
    shutil.copy(os.path.join(good, "config.json"), bin_dir)
    torch.save(load_file(os.path.join(good, "model.safetensors")), os.path.join(bin_dir, "pytorch_model.bin"))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        for spec in sys.argv[2:]:
            layout, _, out = spec.partition("=")
            if layout not in ("single", "sharded", "base") or not out:
                sys.exit(f"make takes LAYOUT=DIR with LAYOUT single, sharded or base, not {spec!r}")
            make(out, shard=layout == "sharded", base=layout == "base")
    elif command == "compare":
        compare(sys.argv[2:])
    elif command == "faults":
        faults(sys.argv[2])
    else:
        sys.exit(f"unknown command {command}")
