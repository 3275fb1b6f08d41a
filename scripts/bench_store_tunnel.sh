#!/usr/bin/env bash
# What the store tunnel adds to a worker's c10d store operation: two cpprun agents on loopback
# (--nnodes=2 --nproc_per_node=1, static rendezvous), each rank timing 2,000 TCPStore `set`s and
# `get`s of 64 bytes and `add`s on its own keys after 200 of each as warm-up
# (scripts/bench_store_ops.py; c10d's `set` does not wait for an answer, `get` and `add` do).
# Run once with a job secret (node 1's rank reaches node 0's store, its store keeper's, through its
# agent, the link and node 0's agent: docs/launcher.md, "Several nodes") and once with
# --no_job_secret (it connects to the store directly); node 0's rank is direct both times. Prints
# p50/p99 µs per op of each rank in each mode, and node 1's tunnel/direct ratio. The ranks are
# Python (torch's TCPStore clients of the keeper's store; a cpprun before the keeper had rank 0
# host it).
#   usage: scripts/bench_store_tunnel.sh [REPEATS]   (default 3; the medians of the repeats)
# Environment: BENCH_PYTHON (default $CPPRUN_TORCH_PYTHON, else .venv/bin/python), BENCH_STORE_OPS
# (default 2000); CPPRUN_BUILD_DIR as for scripts/build.sh (it never builds).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
python=${BENCH_PYTHON:-${CPPRUN_TORCH_PYTHON:-.venv/bin/python}}
cpprun=${CPPRUN_BUILD_DIR:-build}/launcher/cpprun
[ -x "$cpprun" ] || { echo "bench_store_tunnel: no $cpprun: build it first (scripts/build.sh)" >&2; exit 1; }
"$python" -c 'import torch.distributed' || { echo "bench_store_tunnel: $python cannot import torch" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 BENCH_STORE_OPS=${BENCH_STORE_OPS:-2000}

run() {  # MODE (tunnel|direct) N: one job; its ranks' lines go to $work/MODE.N.rank.R
  local mode=$1 n=$2 port=$((29750 + RANDOM % 40)) extra=() secret
  secret=bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  [ "$mode" = direct ] && { extra=(--no_job_secret); secret=; }
  mkdir -p "$work/$mode.$n"
  for node in 1 0; do
    CPPRUN_JOB_SECRET=$secret BENCH_STORE_OUT="$work/$mode.$n" "$cpprun" --nnodes=2 --node_rank=$node \
      --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=$port "${extra[@]}" \
      "$python" scripts/bench_store_ops.py >"$work/$mode.$n.node$node.log" 2>&1 &
  done
  wait || { cat "$work/$mode.$n".node*.log >&2; echo "bench_store_tunnel: the $mode job failed" >&2; exit 1; }
}

median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

for ((n = 0; n < repeats; ++n)); do
  run tunnel "$n"
  run direct "$n"
done
declare -A figure
for mode in tunnel direct; do
  for rank in 0 1; do
    for col in 2 3 4 5 6 7; do
      figure[$mode.$rank.$col]=$(cat "$work"/$mode.*/rank.$rank | awk -v c=$col '{print $c}' | median)
    done
  done
done
echo "store set/get of 64 B and add, µs per op (median of $repeats jobs of $BENCH_STORE_OPS ops each):"
printf '%-8s %-24s %8s %8s %8s %8s %8s %8s\n' mode rank "set p50" "set p99" "get p50" "get p99" "add p50" "add p99"
for mode in tunnel direct; do
  for rank in 0 1; do
    how="rank 0 (node 0, direct)"
    [ "$rank" = 1 ] && how="rank 1 (node 1, $([ "$mode" = tunnel ] && echo tunnel || echo direct))"
    printf '%-8s %-24s %8s %8s %8s %8s %8s %8s\n' "$mode" "$how" "${figure[$mode.$rank.2]}" \
      "${figure[$mode.$rank.3]}" "${figure[$mode.$rank.4]}" "${figure[$mode.$rank.5]}" "${figure[$mode.$rank.6]}" \
      "${figure[$mode.$rank.7]}"
  done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo "node 1, tunnel/direct: get p50 $(ratio "${figure[tunnel.1.4]}" "${figure[direct.1.4]}")x," \
  "get p99 $(ratio "${figure[tunnel.1.5]}" "${figure[direct.1.5]}")x," \
  "add p50 $(ratio "${figure[tunnel.1.6]}" "${figure[direct.1.6]}")x," \
  "add p99 $(ratio "${figure[tunnel.1.7]}" "${figure[direct.1.7]}")x," \
  "set p50 $(ratio "${figure[tunnel.1.2]}" "${figure[direct.1.2]}")x"
