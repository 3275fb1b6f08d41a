#!/usr/bin/env bash
# An AdamW's state moves both ways between cpprun and PyTorch by parameter name: cpprun's save
# (model and optimizer in a sharded directory) loads into torch.optim.AdamW through
# set_optimizer_state_dict(flatten_optimizer_state_dict=True), and its next step gives cpprun's
# parameters (1e-6); PyTorch's state written in the same form continues in cpprun alike; a tied
# parameter's state, saved by save_async, has PyTorch's names and continues alike;
# get_optimizer_state_dict's in-memory dict has PyTorch's keys and values.
# Usage: optimizer_state_interop.sh TOOL PYTHON. Skips (77) without a python that has torch and safetensors.
set -u
tool=$1
python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$python" "$here/optimizer_state_interop.py" init "$dir" || fail "Python could not write the batches"
"$tool" write "$dir" || fail "cpprun could not train and save"
ls "$dir/ckpt"
"$python" "$here/optimizer_state_interop.py" load "$dir" || fail "PyTorch's step from cpprun's state differs"
"$python" "$here/optimizer_state_interop.py" inmem "$dir" || fail "get_optimizer_state_dict differs from PyTorch's"
"$python" "$here/optimizer_state_interop.py" write "$dir" || fail "PyTorch could not write its state"
"$tool" resume "$dir" || fail "cpprun's step from PyTorch's state differs"
mkdir -p "$dir/tied"
"$tool" tied "$dir" || fail "cpprun could not save a tied model's optimizer state"
"$python" "$here/optimizer_state_interop.py" tied "$dir" || fail "a tied parameter's state differs from PyTorch's"
echo "PASS: cpprun <-> PyTorch optimizer state"
