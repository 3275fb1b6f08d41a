#!/usr/bin/env bash
# Pipeline parallelism measured: cpprun's schedules (bench/pipeline_bench.cpp under cpprun) beside
# PyTorch's torch.distributed.pipelining (bench/pipeline_bench.py under torchrun, Gloo) on the same
# model, batch and flags, in one run. For GPipe, 1F1B, Interleaved 1F1B, LoopedBFS (looped) and zero bubble (zb: cpprun's
# ScheduleZeroBubble, PyTorch's ScheduleInterleavedZeroBubble with one stage a rank) at each micro-batch count
# it prints: the step time of both and their ratio, against the floor (the one-process step split
# over the ranks, plus the formula's bubble); each rank's bubble (cpprun's waiting_seconds / seconds,
# and on both sides the part of the step the main thread slept, and the part another process held
# its core) beside (p-1)/(m+p-1) and the issue's (p-1)/m (zero bubble: (p-1)/(3m+p-1), ZB-H1's ideal); the activation
# memory of stage 0's rank (peak resident memory over its size once built; each configuration is a
# process of its own, in a second pass where each large allocation is a mapping of its own) beside
# the tensors its held micro-batches save; rows/s against the model without a pipeline on one
# process.
#   usage: scripts/bench_pipeline.sh [--nproc P] [pipeline_bench's flags: --layers L --dim D --batch B
#                                     --steps N --warmup N --stages-per-rank V]
#   default: 2 ranks, 8 blocks of d = 128, batch 2048 rows, 3 warm-up and 10 timed steps; micro-batch
#   counts 2 4 8 (BENCH_PIPELINE_MICROBATCHES), schedules gpipe 1f1b interleaved looped zb
#   (BENCH_PIPELINE_SCHEDULES). About 7 minutes on 2 cores. See docs/pipeline_parallel.md#measured.
#   BENCH_PIPELINE_ONE_PASS=1: each configuration runs once, in the memory pass's setting, and its
#   step times come from that run (slowed by page faults): half the processes, for a smoke test
#   that checks the figures are printed (tests/dist/pipeline_bench_smoke.sh), not their size.
# Environment as scripts/bench_common.sh (BENCH_PYTHON, BENCH_NO_SETUP=1, CPPRUN_BUILD_DIR). Each
# rank runs 1 thread (OMP_NUM_THREADS=1); the one-process model runs with 1 thread and with P.
set -euo pipefail
if [ "${1:-}" = --nproc ]; then
  [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "bench_pipeline: --nproc needs a number of ranks, got '${2:-}'" >&2; exit 2; }
  export BENCH_NPROC=$2
  shift 2
fi
source "$(dirname "$0")/bench_common.sh"  # cd to the repository; $build, $python
[ -x "$build/bench/pipeline_bench" ] || { echo "bench_pipeline: $build/bench/pipeline_bench is not built (ninja -C $build pipeline_bench cpprun)" >&2; exit 1; }
p=${BENCH_NPROC:-2}
schedules=${BENCH_PIPELINE_SCHEDULES:-gpipe 1f1b interleaved looped zb}
microbatches=${BENCH_PIPELINE_MICROBATCHES:-2 4 8}
one_pass=${BENCH_PIPELINE_ONE_PASS:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run IMPL SCHEDULE M THREADS KEY [FLAG...]: one process group (one process for schedule none) of
# IMPL (cpp, py); its RESULT lines go to $tmp/IMPL.KEY; a run without them prints its ERROR line
# (or the end of its stderr), kept in $tmp/IMPL.KEY.error, and the benchmark carries on.
run() {
  local impl=$1 schedule=$2 m=$3 threads=$4 out=$tmp/$1.$5 cmd rc=0 why
  shift 5
  if [ "$schedule" = none ]; then
    if [ "$impl" = cpp ]; then cmd=("$build/bench/pipeline_bench"); else cmd=("$python" bench/pipeline_bench.py); fi
  elif [ "$impl" = cpp ]; then
    cmd=(tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node="$p" "$build/bench/pipeline_bench")
  else
    cmd=(tests/run_isolated.sh "$python" -m torch.distributed.run --standalone --nproc_per_node="$p" bench/pipeline_bench.py)
  fi
  OMP_NUM_THREADS=$threads timeout 600 "${cmd[@]}" --schedule "$schedule" --microbatches "$m" "${flags[@]}" "$@" \
    >"$tmp/stdout" 2>"$tmp/stderr" || rc=$?
  grep -o 'RESULT .*' "$tmp/stdout" >"$out" || true
  [ -s "$out" ] && return 0
  rm -f "$out"
  why=$(grep -o 'ERROR .*' "$tmp/stdout" | head -n 1)
  [ -n "$why" ] || why="exit status $rc, no RESULT line; its stderr ends: $(grep -v -e NumPy -e _conversion_method "$tmp/stderr" | tail -n 3 | tr '\n' ' ')"
  local pass=""
  [[ $5 == mem.* ]] && pass=" (memory pass)"
  echo "bench_pipeline: $impl $schedule m=$m$pass: $why" | tee "$out.error" >&2
}
# get IMPL KEY RANK FIELD: that rank's value ("-" when the run gave none).
get() {
  local f=$tmp/$1.$2
  [ -s "$f" ] || { echo -; return; }
  awk -v r="$3" -v k="$4" '{ for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == "rank") rank = kv[2]; v[kv[1]] = kv[2] }
                             if (rank == r) { print v[k]; exit } }' "$f"
}
# step_ms IMPL KEY: the slowest rank's median (a step ends when its last rank's does).
step_ms() {
  local f=$tmp/$1.$2
  [ -s "$f" ] || { echo -; return; }
  grep -o 'ms_per_step=[0-9.]*' "$f" | cut -d= -f2 | sort -g | tail -n 1
}
# ratio A B: A / B, or "-" unless both are numbers and B is not 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b == 0) print "-"; else printf "%.2f\n", a / b }'; }

flags=("$@")
load=$(cut -d' ' -f1-3 /proc/loadavg)
for impl in cpp py; do
  run "$impl" none 1 1 one
  run "$impl" none 1 "$p" one_p
done
for m in $microbatches; do
  for schedule in $schedules; do
    if [ "$schedule" = interleaved ] && [ $((m % p)) != 0 ]; then
      echo "bench_pipeline: interleaved m=$m skipped: Interleaved 1F1B needs m a multiple of the $p ranks" >&2
      continue
    fi
    for impl in cpp py; do
      if [ "$one_pass" = 1 ]; then
        MALLOC_MMAP_THRESHOLD_=131072 run "$impl" "$schedule" "$m" 1 "$schedule.$m"
        [ ! -s "$tmp/$impl.$schedule.$m" ] || cp "$tmp/$impl.$schedule.$m" "$tmp/$impl.mem.$schedule.$m"
      else
        run "$impl" "$schedule" "$m" 1 "$schedule.$m"
      fi
    done
  done
done
# Memory, a pass of its own: with every allocation above 128 KiB a mapping of its own, freed
# memory leaves the resident size at once, so the peak resident size follows the live tensors
# (glibc otherwise raises that threshold as tensors are freed and keeps freed heap memory
# resident, which adds up to 12 MB to an interleaved peak). It slows the steps (page faults), so
# the times above are measured without it. Two steps: the peak comes in the first.
for m in $microbatches; do
  [ "$one_pass" = 1 ] && break
  for schedule in $schedules; do
    [ "$schedule" = interleaved ] && [ $((m % p)) != 0 ] && continue
    for impl in cpp py; do
      MALLOC_MMAP_THRESHOLD_=131072 run "$impl" "$schedule" "$m" 1 "mem.$schedule.$m" --steps 1 --warmup 1
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
one=$(step_ms cpp one)
rows=$(get cpp one 0 batch)
layers=$(get cpp one 0 layers)
dim=$(get cpp one 0 dim)
v=$(get cpp "interleaved.${microbatches##* }" 0 v); [ "$v" != - ] || v=2

echo
echo "$p ranks x 1 thread on $(nproc) cores (load average before the runs: $load, after: $load_after); $layers blocks of" \
     "d = $dim, batch $rows rows, float32, MSE; medians of the timed steps."
[ "$p" -ge "$(nproc)" ] && echo "The ranks fill every core: a rank's waiting also includes time the OS gives its core to another" \
     "rank or process, and Gloo's copies take CPU from compute."
echo "No pipeline, one process, the whole batch: cpprun $one ms/step (1 thread), $(step_ms cpp one_p) ms ($p threads);" \
     "PyTorch $(step_ms py one) ms (1 thread), $(step_ms py one_p) ms ($p threads)."
[ "$one_pass" = 0 ] || echo "One pass (BENCH_PIPELINE_ONE_PASS=1): the step times below come from the memory pass's runs," \
  "every allocation above 128 KiB a mapping of its own, so page faults slow them."
echo "Floor: the 1-thread step split over $p ranks plus the formula's bubble, $one / $p x (v m + p - 1) / (v m) ms" \
     "(zb: v = 3, its p - 1 idle slots of 3m)."
echo
printf '%-12s %3s | %10s %10s %8s | %8s %8s | %8s %8s %8s\n' schedule m "cpprun ms" "PyTorch ms" "cpp/Py" "floor ms" "cpp/floor" \
  "rows/s" "/no-PP 1t" "/no-PP ${p}t"
for m in $microbatches; do
  for schedule in $schedules; do
    c=$(step_ms cpp "$schedule.$m")
    [ "$c" != - ] || [ -s "$tmp/py.$schedule.$m" ] || continue
    py=$(step_ms py "$schedule.$m")
    [ -s "$tmp/py.$schedule.$m.error" ] && py=error
    [ -s "$tmp/py.$schedule.$m" ] || [ -s "$tmp/py.$schedule.$m.error" ] || py=-
    # Zero bubble idles p - 1 of 3m slots (F, I, W alike): its floor is the formula with v = 3.
    vv=1; [ "$schedule" = interleaved ] || [ "$schedule" = looped ] && vv=$v; [ "$schedule" = zb ] && vv=3
    floor=$(awk -v t="$one" -v p="$p" -v v="$vv" -v m="$m" 'BEGIN { printf "%.1f", t / p * (v * m + p - 1) / (v * m) }')
    rps=$(awk -v b="$rows" -v c="$c" 'BEGIN { if (c == "-") print "-"; else printf "%.0f", b / c * 1e3 }')
    printf '%-12s %3s | %10s %10s %8s | %8s %8s | %8s %8s %8s\n' "$schedule" "$m" "$c" "$py" "$(ratio "$c" "$py")" \
      "$floor" "$(ratio "$c" "$floor")" "$rps" "$(ratio "$one" "$c")" "$(ratio "$(step_ms cpp one_p)" "$c")"
  done
done

echo
echo "Bubble, each rank, fractions of the step: waiting = cpprun's waiting_seconds / seconds; blocked = the main thread"
echo "(every kernel's: 1 thread a rank) slept; runq = it was ready but another process had the core (/proc/self/schedstat)."
printf '%-12s %3s %4s | %8s | %7s %7s | %7s %7s | %14s %8s\n' schedule m rank waiting "blk cpp" "blk Py" "runq cpp" "runq Py" \
  "(p-1)/(vm+p-1)" "(p-1)/vm"
for m in $microbatches; do
  for schedule in $schedules; do
    [ -s "$tmp/cpp.$schedule.$m" ] || [ -s "$tmp/py.$schedule.$m" ] || continue
    for ((r = 0; r < p; ++r)); do
      f=$(get cpp "$schedule.$m" "$r" formula); [ "$f" != - ] || f=$(get py "$schedule.$m" "$r" formula)
      i=$(get cpp "$schedule.$m" "$r" issue_formula); [ "$i" != - ] || i=$(get py "$schedule.$m" "$r" issue_formula)
      printf '%-12s %3s %4s | %8s | %7s %7s | %7s %7s | %14s %8s\n' "$schedule" "$m" "$r" "$(get cpp "$schedule.$m" "$r" bubble)" \
        "$(get cpp "$schedule.$m" "$r" blocked)" "$(get py "$schedule.$m" "$r" blocked)" \
        "$(get cpp "$schedule.$m" "$r" runq)" "$(get py "$schedule.$m" "$r" runq)" "$f" "$i"
    done
  done
done

echo
echo "Activation memory on stage 0's rank (rank 0), MB: its peak resident memory above its size once built (a pass of"
echo "its own, every allocation above 128 KiB its own mapping); held = the most micro-batches (interleaved, looped: stage passes, 1/v"
echo "the size) whose backward was pending; saved = held x the tensors autograd keeps for one: rows/m x (blocks a stage"
echo "x (10 d + 2) + d) floats. The rest is the stage's gradients and the backward's working memory."
printf '%-12s %3s | %4s %8s | %10s %10s\n' schedule m held saved "cpprun MB" "PyTorch MB"
for m in $microbatches; do
  for schedule in $schedules; do
    [ -s "$tmp/cpp.mem.$schedule.$m" ] || [ -s "$tmp/py.mem.$schedule.$m" ] || continue
    held=$(get cpp "mem.$schedule.$m" 0 peak_held)
    vv=1; [ "$schedule" = interleaved ] || [ "$schedule" = looped ] && vv=$v
    saved=$(awk -v h="$held" -v b="$rows" -v m="$m" -v l="$layers" -v d="$dim" -v p="$p" -v v="$vv" \
      'BEGIN { if (h == "-") print "-"; else printf "%.1f", h * b / m * (l / (p * v) * (10 * d + 2) + d) * 4 / 1048576 }')
    printf '%-12s %3s | %4s %8s | %10s %10s\n' "$schedule" "$m" "$held" "$saved" "$(get cpp "mem.$schedule.$m" 0 act_mb)" \
      "$(get py "mem.$schedule.$m" 0 act_mb)"
  done
done
for m in $microbatches; do
  g=$(get cpp "mem.gpipe.$m" 0 act_mb) o=$(get cpp "mem.1f1b.$m" 0 act_mb)
  gp=$(get py "mem.gpipe.$m" 0 act_mb) op=$(get py "mem.1f1b.$m" 0 act_mb)
  [ "$g" != - ] && [ "$o" != - ] || continue
  echo "1F1B / GPipe at m=$m: cpprun $(ratio "$o" "$g"), PyTorch $(ratio "$op" "$gp"); held min(p, m) / m =" \
       "$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.2f", (p < m ? p : m) / m }')"
done
ls "$tmp"/*.error >/dev/null 2>&1 && { echo; echo "Runs that gave no figures:"; cat "$tmp"/*.error; }
exit 0
