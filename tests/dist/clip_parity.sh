#!/usr/bin/env bash
# cpprun's clipping against Python's torch.nn.utils.clip_grad_norm_ on the same float32 gradients
# (DDP's clip_grad_norm, and cpprun::clip_grad_norm_ on a plain module, also one of float32 and
# bfloat16 gradients): norm types 2, 1, inf and 3, clipping and not; the clipped gradients and the
# norm equal to the bit.
# Usage: clip_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python that has torch and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
# Bit for bit only against the same PyTorch: another version may round otherwise.
linked=$("$probe" --torch-version) || fail "the probe cannot say its LibTorch's version"
imported=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])') || fail "python cannot import torch"
if [ "$linked" != "$imported" ]; then
  echo "SKIP: the probe links LibTorch $linked, $python imports torch $imported; bit-for-bit needs one version"
  exit 77
fi
"$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" || fail "cpprun's side failed"
"$python" "$here/clip_parity.py" "$dir" || fail "cpprun's clipping differs from PyTorch's"
echo "PASS"
