#!/usr/bin/env bash
# scripts/bench_pipeline.sh at a tiny size (8 blocks of d = 32, batch 64, 1 warm-up and 1 timed
# step, m = 4, 2 ranks; cpprun and PyTorch's torch.distributed.pipelining): it exits 0 and prints
# what it promises — a row of step times per schedule with both sides' figures, each rank's bubble
# row with cpprun's waiting fraction and both sides' blocked and run-queue fractions between 0 and
# 1, and stage 0's activation memory with the micro-batches it held, which must be the schedules'
# own (GPipe m, 1F1B min(p, m), Interleaved 1F1B's warm-up plus one, LoopedBFS v m, zero bubble min(p, m) on
# its first rank). No timing is asserted. One pass (BENCH_PIPELINE_ONE_PASS=1): each configuration
# runs once, for both tables, which halves the processes (each torchrun run starts three Pythons
# that import torch; two passes took 246 s of the 240 allowed in a CI run beside other tests).
# Usage: pipeline_bench_smoke.sh BUILD_DIR PYTHON. Skips (77) without a python with torch.
set -u
build=$1 python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch

BENCH_PIPELINE_ONE_PASS=1 BENCH_PIPELINE_MICROBATCHES=4 BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" timeout 240 \
  bash "$here/../../scripts/bench_pipeline.sh" --layers 8 --dim 32 --batch 64 --steps 1 --warmup 1 >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "scripts/bench_pipeline.sh exited $rc (above)"
grep -q 'Runs that gave no figures' "$dir/out" && fail "a run gave no figures (above)"

number='^[0-9]+(\.[0-9]+)?$'
fraction() { awk -v x="$1" 'BEGIN { exit !(x ~ /^[0-9.]+$/ && x >= 0 && x <= 1) }'; }
for schedule in gpipe 1f1b interleaved looped zb; do
  # The step-time row has 13 fields, the memory row 8.
  read -r -a f <<<"$(awk -v s="$schedule" '$1 == s && $2 == 4 && $3 == "|" && NF == 13' "$dir/out")"
  [ ${#f[@]} = 13 ] || fail "$schedule: no step-time row of 13 fields: ${f[*]}"
  for i in 3 4 5 7 8 10 11 12; do
    [[ ${f[$i]} =~ $number ]] || fail "$schedule: step-time field $((i + 1)) '${f[$i]}' is not a number: ${f[*]}"
  done
  for r in 0 1; do
    read -r -a b <<<"$(awk -v s="$schedule" -v r="$r" '$1 == s && $2 == 4 && $3 == r && $4 == "|"' "$dir/out")"
    [ ${#b[@]} = 14 ] || fail "$schedule rank $r: no bubble row of 14 fields: ${b[*]}"
    for i in 4 6 7 9 10 12 13; do fraction "${b[$i]}" || fail "$schedule rank $r: bubble field $((i + 1)) '${b[$i]}' is no fraction: ${b[*]}"; done
  done
  read -r -a mem <<<"$(awk -v s="$schedule" '$1 == s && $2 == 4 && $3 == "|" && NF == 8' "$dir/out")"
  [ ${#mem[@]} = 8 ] || fail "$schedule: no memory row of 8 fields: ${mem[*]}"
  want=$(case $schedule in gpipe) echo 4 ;; 1f1b | zb) echo 2 ;; interleaved) echo 5 ;; looped) echo 8 ;; esac)
  [ "${mem[3]}" = "$want" ] || fail "$schedule: stage 0 held ${mem[3]} micro-batches at once, the schedule's is $want: ${mem[*]}"
  for i in 4 6 7; do [[ ${mem[$i]} =~ $number ]] || fail "$schedule: memory field $((i + 1)) '${mem[$i]}' is not a number: ${mem[*]}"; done
done
grep -Eq '^1F1B / GPipe at m=4: cpprun [0-9.]+, PyTorch [0-9.]+; held min\(p, m\) / m = 0\.50$' "$dir/out" ||
  fail "no 1F1B / GPipe memory line with both ratios"
echo "PASS: scripts/bench_pipeline.sh ran every schedule on both sides and printed every figure"
