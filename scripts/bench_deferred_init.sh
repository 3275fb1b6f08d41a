#!/usr/bin/env bash
# Deferred initialisation's memory: the largest rank's peak resident memory growth, from building
# an MLP of 32 Linear(1024, 1024) (Psi = 33.6M, one unit per Linear) to the end of 3 fp32 steps,
# at 4 ranks, for DDP, ZeRO-3 of a model built eagerly and ZeRO-3 of a model built with
# cpprun::deferred_init (bench/deferred_init_memory.cpp); with AdamW and with plain SGD; next to
# the formulas: DDP 16 Psi bytes with AdamW (parameters, gradients, two moments), 8 Psi with SGD;
# ZeRO-3 a quarter of that, plus what a few gathered units take. Eager ZeRO-3 also holds the whole
# model (4 Psi) while it builds it: with AdamW at 4 ranks that is as much as training takes
# (16 Psi / 4), with SGD twice as much. The floor adds what ZeRO-3 holds at once beyond the
# shards in backward, its busiest moment: two units' full parameters (the one computing and the
# one prefetched) and two units' full gradients (the one being produced and the one being
# reduce-scattered), 4 bytes a parameter each.
#   usage: scripts/bench_deferred_init.sh [LAYERS] [WIDTH]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CPPRUN_BUILD_DIR:-build}
layers=${1:-32} width=${2:-1024} n=4
[ -x "$build/bench/deferred_init_memory" ] || { echo "bench: build $build/bench/deferred_init_memory first (scripts/build.sh)" >&2; exit 1; }
# Large blocks straight from and back to the kernel, so that resident memory follows live tensors.
export MALLOC_MMAP_THRESHOLD_=65536
echo "cores: $(nproc); $n ranks; MLP of $layers Linear($width, $width); fp32"
printf '%-9s %-15s %10s %8s %11s %9s %9s %10s\n' optimizer mode "peak MB" "/ DDP" "formula MB" "peak/form" "floor MB" "peak/floor"
for optimizer in adamw sgd; do
  ddp_peak=
  for mode in ddp zero3-eager zero3-deferred; do
    line=$(tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=$n \
             "$build/bench/deferred_init_memory" --mode "$mode" --optimizer "$optimizer" --layers "$layers" \
             --width "$width" 2>/dev/null | grep RESULT) ||
      { echo "bench: --mode $mode --optimizer $optimizer printed no RESULT line" >&2; exit 1; }
    psi=$(sed -n 's/.* psi=\([0-9]*\).*/\1/p' <<<"$line")
    unit=$(sed -n 's/.* unit_params=\([0-9]*\).*/\1/p' <<<"$line")
    peak=$(sed -n 's/.* peak_growth=\([0-9]*\).*/\1/p' <<<"$line")
    [ -n "$ddp_peak" ] || ddp_peak=$peak
    awk -v opt="$optimizer" -v mode="$mode" -v psi="$psi" -v unit="$unit" -v peak="$peak" -v ddp="$ddp_peak" -v n="$n" 'BEGIN {
      per = (opt == "sgd" ? 8 : 16); f = (mode == "ddp" ? per * psi : per * psi / n)
      floor = (mode == "ddp" ? f : f + 4 * 4 * unit)
      printf "%-9s %-15s %10.1f %8.3f %11.1f %9.2f %9.1f %10.2f\n", opt, mode, peak / 1e6, peak / ddp, f / 1e6, peak / f, floor / 1e6, peak / floor }'
  done
done
echo "(peak MB: the largest rank's peak resident memory growth, building included; / DDP: over DDP's;"
echo " formula: DDP 16 Psi bytes (AdamW) or 8 Psi (SGD), ZeRO-3 that / $n; floor: ZeRO-3's formula plus"
echo " 2 units' full parameters and 2 units' full gradients; the target with AdamW at 4 ranks and 8 layers:"
echo " ZeRO-3 <= 0.32 x DDP eager, <= 0.30 x DDP deferred)"
