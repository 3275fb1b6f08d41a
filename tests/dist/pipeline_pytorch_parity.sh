#!/usr/bin/env bash
# cpprun's pipeline schedules against PyTorch's own (torch.distributed.pipelining): on 2 ranks, the
# same float64 Sequential of 8 children cut into the same stages (one a rank for GPipe, 1F1B and
# zero bubble, PyTorch's ScheduleInterleavedZeroBubble with one stage each; two a rank for
# interleaved 1F1B and looped BFS), trained 3 SGD-with-momentum steps of 4 micro-batches (and
# interleaved 1F1B at 3, PyTorch's flexible rounds) from the same parameters on the same batches; the mean micro-batch losses of every step and the final
# parameters agree within 1e-10 of PyTorch's.
# Usage: pipeline_pytorch_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
export PYTHON_EXEC=$python  # the interpreter cpprun runs pipeline_pytorch_parity.py with
py=$here/pipeline_pytorch_parity.py
"$python" "$py" init "$dir" || fail "Python could not write the parameters and batches"
for schedule in gpipe 1f1b zero-bubble interleaved-1f1b interleaved-odd looped-bfs; do
  "$cpprun" --standalone --nproc_per_node=2 "$py" train "$dir" "$schedule" || fail "PyTorch's pipeline ($schedule) failed"
  "$cpprun" --standalone --nproc_per_node=2 "$probe" "$dir" "$schedule" || fail "cpprun's pipeline ($schedule) failed"
  "$python" "$py" compare "$dir" "$schedule" || fail "cpprun's pipeline ($schedule) trains otherwise than PyTorch's"
done
echo "PASS"
