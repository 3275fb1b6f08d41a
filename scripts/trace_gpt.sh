#!/usr/bin/env bash
# Where cpprun's train_gpt and its PyTorch twin spend their time, kernel by kernel: both train the
# same GPT from the same checkpoint without a wrapper (as scripts/bench_gpt.sh's "none" rows), each
# traces the 3 steps after the warm-up with PyTorch's profiler (--trace), and bench/trace_kernels.py
# compares the traces: device time and idle time, then the kernels whose time differs most.
#   usage: scripts/trace_gpt.sh [--gpt2] [OUT_DIR]   (the traces stay in OUT_DIR, default a temporary one)
#   --gpt2: GPT-2 124M's shape, bf16, batch 16 (bench_gpt.sh --gpt2's); default the tiny shape, fp32.
# Environment as scripts/bench_common.sh (BENCH_DEVICE=cuda, BENCH_PYTHON, BENCH_NO_SETUP=1,
# CPPRUN_BUILD_DIR). The traced steps run slower than untraced ones (the profiler's own cost).
set -euo pipefail
gpt2=0
[ "${1:-}" = --gpt2 ] && { gpt2=1; shift; }
source "$(dirname "$0")/bench_common.sh"  # cd to the repository; $build, $device, $python
keep=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=${keep:-$tmp}
mkdir -p "$out"
[ "$device" != cpu ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$gpt2" = 1 ]; then
  shape=(--layers 12 --embed 768 --heads 12) block=1024 vocab=50304 batch=16 amp=bf16
else
  shape=(--layers 2 --embed 64 --heads 4) block=64 vocab=0 batch=8 amp=fp32
fi
cat README.md docs/*.md >"$tmp/text.md"
"$python" bench/gpt_twin.py --write-init "$tmp/init" --text "$tmp/text.md" "${shape[@]}" --block "$block" \
  --vocab "$vocab" --gelu tanh >"$tmp/init.log" 2>&1 || { cat "$tmp/init.log" >&2; exit 1; }
common=(--init-from "$tmp/init" --text "$tmp/text.md" --block "$block" --batch "$batch" --steps 8 --warmup 3 --amp "$amp")
tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/examples/train_gpt" --mode none \
  "${common[@]}" --log-every 8 --sample 0 --straggler-every 0 --trace "$out/cpprun.json" >"$out/cpprun.log" 2>&1 ||
  { tail -5 "$out/cpprun.log" >&2; echo "trace_gpt: train_gpt failed" >&2; exit 1; }
tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=1 "$python" bench/gpt_twin.py --mode none \
  "${common[@]}" --device "$device" --trace "$out/pytorch.json" >"$out/pytorch.log" 2>&1 ||
  { tail -5 "$out/pytorch.log" >&2; echo "trace_gpt: the twin failed" >&2; exit 1; }
echo "trace_gpt: $([ $gpt2 = 1 ] && echo "GPT-2 124M shape" || echo "tiny GPT"), batch $batch, $amp, $device; steps 4-6 of 8 traced"
"$python" bench/trace_kernels.py "$out/cpprun.json" "$out/pytorch.json"
