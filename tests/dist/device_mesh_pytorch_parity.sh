#!/usr/bin/env bash
# cpprun::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}) against PyTorch's init_device_mesh("cpu",
# (2, 2), mesh_dim_names=("dp", "tp")), each under cpprun at 4 ranks with no process group before
# the call: both join the default group, every rank's dp and tp groups hold the same ranks and its
# coordinate is the same, and both refuse (or accept) the same calls (repeated names, too few or too
# many names, a mesh bigger than the world, a device index, a negative size; 1-d and 3-d meshes).
# Usage: device_mesh_pytorch_parity.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch
"$cpprun" --standalone --nproc_per_node=4 "$python" "$here/device_mesh_pytorch_parity.py" "$dir" \
  || fail "PyTorch's side failed"
"$cpprun" --standalone --nproc_per_node=4 "$probe" "$dir" || fail "cpprun's side failed"
for rank in 0 1 2 3; do
  [ -s "$dir/py.$rank" ] && [ -s "$dir/cpp.$rank" ] || fail "rank $rank wrote no result"
  if ! diff -u "$dir/py.$rank" "$dir/cpp.$rank"; then
    fail "rank $rank: cpprun's mesh (+) differs from PyTorch's (-)"
  fi
done
cat "$dir/cpp.0"
echo "PASS"
