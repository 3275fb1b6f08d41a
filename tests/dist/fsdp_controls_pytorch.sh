#!/usr/bin/env bash
# cpprun's FSDP2 controls against PyTorch's own (fully_shard): gradient accumulation with
# set_requires_gradient_sync / set_reshard_after_backward, HSDP's set_requires_all_reduce, and
# set_gradient_divide_factor (float64, and reduced in float32 with set_force_sum_reduction_for_comms), and
# mixed precision's defaults (bf16 compute, reduced and accumulated in float64), and a frozen weight
# under mixed precision (sharded and cast, never reduced), on 2 ranks in float64;
# the trained biases equal to the bit, the weights to 1e-12 (fsdp_controls_pytorch.cpp / .py).
# Usage: fsdp_controls_pytorch.sh PROBE CPPRUN PYTHON. Skips (77) without a python that has torch
# and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" || fail "cpprun's side failed"
"$cpprun" --standalone --nproc_per_node=2 "$python" "$here/fsdp_controls_pytorch.py" "$dir" \
  || fail "cpprun's FSDP2 controls differ from PyTorch's"
echo "PASS"
