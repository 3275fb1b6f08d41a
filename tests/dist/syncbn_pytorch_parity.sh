#!/usr/bin/env bash
# cpprun's SyncBatchNorm under its DDP on 2 ranks whose batches differ in size (5 and 7) against
# PyTorch's BatchNorm in one process on both batches (what torch.nn.SyncBatchNorm computes on a GPU;
# on the CPU PyTorch's refuses to run): float64 models converted by convert_sync_batchnorm (a CNN
# with BatchNorm2d at the default momentum and at momentum None, the cumulative average; Conv1d with
# BatchNorm1d on [N, C, L] without affine parameters, then BatchNorm1d on [N, C]) trained 4 SGD
# steps from the same parameters on the same batches (the reference's loss the mean of the ranks'
# mean losses, as DDP's gradient): parameters, running statistics, num_batches_tracked and the
# eval-mode output agree within 1e-10 of PyTorch's.
# Usage: syncbn_pytorch_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
py=$here/syncbn_pytorch_parity.py
"$python" "$py" init "$dir" || fail "Python could not write the parameters and batches"
for model in cnn seq; do
  "$python" "$py" reference "$dir" "$model" || fail "PyTorch's BatchNorm ($model) failed"
  "$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" "$model" || fail "cpprun's SyncBatchNorm ($model) failed"
  "$python" "$py" compare "$dir" "$model" || fail "cpprun's SyncBatchNorm ($model) trains otherwise than PyTorch's"
done
echo "PASS"
