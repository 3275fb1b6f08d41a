#!/usr/bin/env bash
# DDP benchmark: cpprun's C++ DistributedDataParallel against PyTorch's Python DDP (PyTorch 2.15
# from the project's .venv, whose LibTorch the C++ side links too; Gloo), side by side on this
# machine. BENCH_NPROC ranks (default 2), 1 thread per rank, 64 samples per rank, MLP
# 1024-[H x 4]-10 at H=1024 (4.2M parameters) and H=2720 (25M). Both sides are started by cpprun.
#
# Prints three tables:
#  1. both stacks at their defaults: samples/s, C++/Python, and communication overhead = DDP step
#     time / step time of the same per-rank work without communication;
#  2. the same with gradient_as_bucket_view on both sides (no gradient copies in or out);
#  3. the floor: one all-reduce of all the gradients alone, its wall and CPU time per rank, and
#     the overhead it alone implies when the ranks' compute already fills every core
#     (AR CPU / local step): no overlap can hide CPU time that no core has to spare.
# Each figure is the median of REPEATS runs (default 3), the C++ and Python runs alternating, so
# that a slow minute on a shared machine does not land on one side only.
#   usage: scripts/bench_ddp.sh [steps_scale] [repeats]   (defaults 1 and 3: 20 and 10 timed steps)
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
scale=${1:-1}
repeats=${2:-3}
configs=("1024 4.2M $((20 * scale))" "2720 25M $((10 * scale))")
declare -A local_ms py_default_ms
samples=$((64 * ${BENCH_NPROC:-2}))  # per step, over all the ranks

# median_pair MODE HIDDEN STEPS [FLAG...]: "C++ wall, C++ CPU, Python wall, Python CPU" ms/step,
# each the median over the repeats.
median_pair() {
  local cw=() cc=() pw=() pc=() w c out impl
  for ((r = 0; r < repeats; ++r)); do
    for impl in cpp py; do
      out=$(run_dp_with_cpu "$impl" "$@")
      [ -n "$out" ] || { echo "bench_ddp: $impl $* printed no RESULT line (rerun it by hand to see why)" >&2; exit 1; }
      read -r w c <<<"$out"
      if [ "$impl" = cpp ]; then cw+=("$w"); cc+=("$c"); else pw+=("$w"); pc+=("$c"); fi
    done
  done
  echo "$(median <<<"${cw[*]}") $(median <<<"${cc[*]}") $(median <<<"${pw[*]}") $(median <<<"${pc[*]}")"
}

ddp_table() {  # $1: title; further arguments go to both sides' DDP runs
  local title=$1
  shift
  printf '\n%s\n%-7s %-8s %12s %12s %12s %12s %9s %14s %14s\n' "$title" model params "C++ ms/step" \
    "Py ms/step" "C++ samp/s" "Py samp/s" "C++/Py" "C++ overhead" "Py overhead"
  for config in "${configs[@]}"; do
    read -r hidden params steps <<<"$config"
    pair=$(median_pair ddp "$hidden" "$steps" "$@")  # an assignment, so that a failed run stops the script
    read -r cpp_ddp _ py_ddp _ <<<"$pair"
    if [ -z "${local_ms[$hidden]:-}" ]; then
      pair=$(median_pair local "$hidden" "$steps")
      read -r cpp_local _ py_local _ <<<"$pair"
      local_ms[$hidden]="$cpp_local $py_local"
      py_default_ms[$hidden]=$py_ddp
    fi
    read -r cpp_local py_local <<<"${local_ms[$hidden]}"
    awk -v n="$samples" -v h="$hidden" -v p="$params" -v cd="$cpp_ddp" -v pd="$py_ddp" -v cl="$cpp_local" -v pl="$py_local" 'BEGIN {
      printf "%-7s %-8s %12.1f %12.1f %12.0f %12.0f %8.2fx %13.0f%% %13.0f%%\n", "H=" h, p, cd, pd,
        1000 * n / cd, 1000 * n / pd, pd / cd, 100 * (cd / cl - 1), 100 * (pd / pl - 1) }'
  done
}

ddp_table "Defaults (gradient_as_bucket_view off):"
ddp_table "gradient_as_bucket_view on, both sides:" --bucket-view

printf '\n%s\n%-7s %-8s %10s %11s %12s %11s %12s %15s %13s\n' \
  "Floor: one all-reduce of all the gradients, alone (CPU = rank 0's process, every thread):" \
  model params "local ms" "C++ AR ms" "C++ AR CPU" "Py AR ms" "Py AR CPU" "overhead floor" "best C++/Py"
for config in "${configs[@]}"; do
  read -r hidden params steps <<<"$config"
  pair=$(median_pair allreduce "$hidden" "$steps")
  read -r cpp_ar cpp_ar_cpu py_ar py_ar_cpu <<<"$pair"
  read -r cpp_local _ <<<"${local_ms[$hidden]}"
  # best C++/Py: Python's default DDP step against a C++ step that costs only its compute plus
  # its all-reduce's CPU time.
  awk -v h="$hidden" -v p="$params" -v cl="$cpp_local" -v ca="$cpp_ar" -v cc="$cpp_ar_cpu" -v pa="$py_ar" \
      -v pc="$py_ar_cpu" -v pd="${py_default_ms[$hidden]}" 'BEGIN {
    printf "%-7s %-8s %10.1f %11.1f %12.1f %11.1f %12.1f %14.0f%% %12.2fx\n", "H=" h, p, cl, ca, cc, pa, pc,
      100 * cc / cl, pd / (cl + cc) }'
done
