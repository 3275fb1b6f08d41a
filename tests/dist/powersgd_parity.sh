#!/usr/bin/env bash
# cpprun::powerSGD_hook against PyTorch's powerSGD_hook: DDP on 2 ranks trains a float64 MLP for 6
# steps from the same parameters on the same batches, under four PowerSGD configurations (rank 1
# and warm start; rank 3 by QR, cold; shapes batched, an epsilon, another seed; no error
# feedback, from the first step); the parameters agree within 1e-10 of PyTorch's.
# Usage: powersgd_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch, numpy and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch numpy safetensors.torch
export PYTHON_EXEC=$python  # the interpreter cpprun runs powersgd_parity.py with
py=$here/powersgd_parity.py
"$python" "$py" init "$dir" || fail "Python could not write the parameters and batches"
for config in rank1 qr_cold batched no_feedback; do
  "$cpprun" --standalone --nproc_per_node=2 "$py" train "$dir" "$config" || fail "PyTorch's DDP ($config) failed"
  "$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" "$config" || fail "cpprun's DDP ($config) failed"
  "$python" "$py" compare "$dir" "$config" || fail "cpprun's PowerSGD ($config) trains otherwise than PyTorch's"
done
echo "PASS"
