#!/usr/bin/env bash
# cpprun's tensor parallelism against PyTorch's own (parallelize_module over DTensor): on 2 ranks,
# the same float64 Sequential (embedding, LayerNorm, MLP, LayerNorm, head) under the same plan,
# trained 5 AdamW steps from the same parameters on the same batches, once with Megatron's
# column/row split and once sequence parallel (torchtitan's plan: a vocabulary-split embedding
# reduce-scattered along the sequence, LayerNorms on sequence shards); the losses of every step and
# the gathered parameters agree within 1e-10 of PyTorch's. So each style's name means what PyTorch's does.
# Usage: tp_pytorch_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
export PYTHON_EXEC=$python  # the interpreter cpprun runs tp_pytorch_parity.py with
py=$here/tp_pytorch_parity.py
"$python" "$py" init "$dir" || fail "Python could not write the parameters and batches"
for plan in megatron sequence; do
  "$cpprun" --standalone --nproc_per_node=2 "$py" train "$dir" "$plan" || fail "PyTorch's tensor parallelism ($plan) failed"
  "$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" "$plan" || fail "cpprun's tensor parallelism ($plan) failed"
  "$python" "$py" compare "$dir" "$plan" || fail "cpprun's tensor parallelism ($plan) trains otherwise than PyTorch's"
done
echo "PASS"
