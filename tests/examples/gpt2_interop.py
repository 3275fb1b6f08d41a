"""transformers' side of tests/examples/gpt2_interop.sh: a small random GPT-2 built from a config
(nothing downloaded), its logits compared with the ones train_gpt wrote, and directories that
train_gpt must refuse.

  gpt2_interop.py make DIR [--shard|--base]  a random GPT2LMHeadModel, save_pretrained(DIR) (sharded: several files +
                                         index; base: its GPT2Model alone, names without "transformer.", as the Hub's gpt2)
  gpt2_interop.py compare DIR IDS FILE   from_pretrained(DIR)'s logits for IDS equal FILE's within 1e-5
  gpt2_interop.py faults DIR             DIR/<case> for each fault: a config option train_gpt lacks, a missing tensor
"""
import json
import os
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


def compare(model_dir, ids, path):
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    tokens = torch.tensor([[int(i) for i in ids.split(",")]])
    with torch.no_grad():
        expected = model(tokens).logits[0].double().numpy()
    got = np.loadtxt(path, ndmin=2)
    if got.shape != expected.shape:
        print(f"FAIL: {path} holds logits of shape {got.shape}, transformers gives {expected.shape}")
        sys.exit(1)
    diff = float(np.abs(got - expected).max())
    print(f"max |train_gpt - transformers| over {expected.size} logits: {diff:.3g} (scale {np.abs(expected).max():.3g})")
    if not diff <= TOLERANCE:
        print(f"FAIL: logits differ by {diff} > {TOLERANCE}")
        sys.exit(1)


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


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], shard="--shard" in sys.argv[3:], base="--base" in sys.argv[3:])
    elif command == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "faults":
        faults(sys.argv[2])
    else:
        sys.exit(f"unknown command {command}")
