#!/usr/bin/env bash
# AdamW's step time: LibTorch's torch::optim::AdamW and cpprun::FusedAdamW (bench/adamw_bench.cpp)
# beside PyTorch's torch.optim.AdamW fused, foreach and for-loop (bench/adamw_bench.py), over the
# same GPT parameter list, in one run; prints each in ms per step and the ratios to FusedAdamW.
#   usage: scripts/bench_adamw.sh [adamw_bench's flags: --device cpu|cuda --layers L --embed C --vocab V
#                                  --block T --steps N --warmup N]
#   default: GPT-2 124M's tensors (148 of them, 124M parameters) on the CPU; on this 2-core machine
#   a mid-size model (--layers 4 --embed 256 --vocab 8192 --block 256) takes seconds.
# Environment as scripts/bench_common.sh (BENCH_PYTHON, BENCH_NO_SETUP=1, CPPRUN_BUILD_DIR). On the
# CPU each side runs with OMP_NUM_THREADS unless set (default: every core, as a training run would).
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"  # cd to the repository; $build, $python
[ -x "$build/bench/adamw_bench" ] || { echo "bench_adamw: $build/bench/adamw_bench is not built (ninja -C $build adamw_bench)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bench/adamw_bench" "$@" | tee "$tmp/cpp.out"
"$python" bench/adamw_bench.py "$@" | tee "$tmp/py.out"
ms() { grep "impl=$1 " "$tmp"/*.out | grep -o 'ms_per_step=[0-9.]*' | cut -d= -f2; }
fused=$(ms fused)
echo
for impl in libtorch fused torch-fused torch-foreach torch-forloop; do
  awk -v i="$impl" -v m="$(ms "$impl")" -v f="$fused" 'BEGIN { printf "%-14s %10.3f ms/step  %6.2fx cpprun::FusedAdamW'"'"'s time\n", i, m, m / f }'
done
