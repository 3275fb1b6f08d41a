#!/usr/bin/env bash
# cpprun::GradScaler against torch.amp.GradScaler on the CPU, one process: 12 SGD steps of float32
# parameters at init_scale 8 and growth_interval 2, an inf gradient at steps 3 and 7, a NaN at 5,
# unscale_ and clip_grad_norm_ before step 9: the scale after every update is PyTorch's exactly
# (the skipped steps and the growth alike), the parameters within 1e-6.
# Usage: grad_scaler_interop.sh PROBE PYTHON. Skips (77) without a python with torch and safetensors.
set -u
probe=$1
python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$python" "$here/grad_scaler_interop.py" run "$dir" || fail "PyTorch's GradScaler run failed"
"$probe" "$dir" || fail "cpprun's GradScaler run failed"
"$python" "$here/grad_scaler_interop.py" compare "$dir" || fail "cpprun's GradScaler scales otherwise than PyTorch's"
echo "PASS"
