#!/usr/bin/env bash
# Memory benchmark: per-rank bytes in parameters, gradients and optimizer state (fp32 AdamW) for
# cpprun's DDP and ZeRO-1/2/3 at 2 and 4 ranks, steady state (after a step) and peak (during
# forward/backward), next to the ZeRO paper's formulas for the same Psi. MLP 1024-[1024 x 4]-10
# (Psi = 4.21M), one unit per Linear (the largest unit: 1.05M parameters). "-min": with
# gathered_unit_limit 1 and no prefetch. "formula+1u" adds what one unit needs while it computes:
# its full gradient (ZeRO-2) and its gathered parameters (ZeRO-3), 4 bytes each; for ZeRO-1 the
# reduction in flight and the one launching, each a unit's reduced rows (4 bytes x unit / N).
# RSS growth: the process's peak resident memory over its size before building the model
# (activations, allocator slack and all).
#   usage: scripts/bench_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/build.sh >/dev/null
build=${CPPRUN_BUILD_DIR:-build}
unit=1049600  # parameters in the largest unit

printf '%-10s %2s %9s %9s %9s %10s %9s %10s %11s %7s %8s %8s\n' mode N "params MB" "grads MB" "optim MB" \
  "steady/Psi" "formula" "peak/Psi" "formula+1u" "peak/f" "kept MB" "RSS+ MB"
for n in 2 4; do
  for mode in ddp zero1 zero2 zero2-min zero3 zero3-min; do
    line=$(tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=$n "$build/bench/fsdp_memory" \
             --mode "$mode" 2>/dev/null | grep RESULT)
    eval "$(echo "$line" | sed 's/^.*RESULT //; s/ /\n/g' | sed 's/^/m_/')"
    awk -v mode="$mode" -v n="$n" -v psi="$m_psi" -v p="$m_params" -v g="$m_grads" -v o="$m_optim" \
        -v pp="$m_peak_params" -v pg="$m_peak_grads" -v kept="${m_kept:-0}" -v rss="$m_rss_growth" -v unit="$unit" 'BEGIN {
      if (mode == "ddp") f = 16; else if (mode == "zero1") f = 8 + 8 / n; else if (mode ~ /^zero2/) f = 4 + 12 / n;
      else f = 16 / n;
      fu = f + (mode ~ /zero3/ ? 8 * unit / psi : mode ~ /zero2/ ? 4 * unit / psi : \
                mode == "zero1" ? 8 * unit / (n * psi) : 0)
      steady = (p + g + o) / psi; peak = (pp + pg + o) / psi
      printf "%-10s %2d %9.1f %9.1f %9.1f %10.2f %9.2f %10.2f %11.2f %7.2f %8.1f %8.1f\n", mode, n, p / 1e6, g / 1e6,
        o / 1e6, steady, f, peak, fu, peak / fu, kept / 1e6, rss / 1e6 }'
  done
done
echo "(bytes per parameter of the model: steady = after optimizer.step(); peak adds the gathered"
echo " units and the full gradients alive during backward; kept = released full parameters kept"
echo " for reuse at the end, within gathered_unit_limit, not in steady)"
