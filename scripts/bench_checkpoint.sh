#!/usr/bin/env bash
# A sharded checkpoint of model + optimizer, saved and loaded, against the disk's own rates:
# bench/checkpoint_bench.cpp (Linear(H, H) + ReLU x LAYERS, AdamW; default H 2048 x 12: 201 MB of
# model, 604 MB a save with AdamW's state) under DDP and FSDP stage 3 at 2 and 4 ranks, 1 thread
# each, and its PyTorch twin bench/checkpoint_bench.py (torch.distributed.checkpoint: dcp.save,
# dcp.load, dcp.async_save over Gloo on the CPU) at 2 ranks. First the disk: dd's write
# (conv=fdatasync) and read (after dropping the page cache as root, else iflag=direct) of
# BENCH_DD_MB MiB in DIR. Then one row per run: save and load, seconds and GB/s (bytes on disk /
# seconds, GB = 1e9) and as a share of dd's; the background save (save_async / dcp.async_save):
# how long the call blocks training against the synchronous save, how long until it is done, and
# a training step during the write against one without. Each row is a median of REPEATS; each
# run's load average (uptime) is printed beside it. Then cpprun against PyTorch, as ratios, and
# each run's RESULT line (the model's and the optimizer's parts, rank 0's CPU seconds).
#   usage: scripts/bench_checkpoint.sh [REPEATS] [DIR]   (REPEATS default 3, DIR default /tmp)
# Environment: BENCH_CHECKPOINT_RANKS (default "2 4"), BENCH_CHECKPOINT_MODES ("ddp zero3"),
# BENCH_CHECKPOINT_MODEL ("2048 12": hidden, layers), BENCH_CHECKPOINT_PY_RANKS (the rank counts
# the PyTorch twin runs at, default "2"; empty: none), BENCH_DD_MB (512), BENCH_DROP_CACHES (1: drop
# the page cache before dd's read and each load, as root; 0: never, the loads then read a warm
# cache), BENCH_PYTHON (the python with torch, default .venv/bin/python); CPPRUN_BUILD_DIR as for
# scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CPPRUN_BUILD_DIR:-build}
repeats=${1:-3} dir=${2:-/tmp}
ranks=${BENCH_CHECKPOINT_RANKS:-2 4} modes=${BENCH_CHECKPOINT_MODES:-ddp zero3}
py_ranks=${BENCH_CHECKPOINT_PY_RANKS-2} dd_mb=${BENCH_DD_MB:-512}
read -r hidden layers <<<"${BENCH_CHECKPOINT_MODEL:-2048 12}"
python=${BENCH_PYTHON:-$PWD/.venv/bin/python}
prog=$build/bench/checkpoint_bench launcher=$build/launcher/cpprun
for f in "$prog" "$launcher"; do
  [ -x "$f" ] || { echo "bench: build $f first (cmake --build $build --target checkpoint_bench cpprun)" >&2; exit 1; }
done
drop=no  # "yes": we drop the page cache (root, and BENCH_DROP_CACHES not 0)
[ "${BENCH_DROP_CACHES:-1}" != 0 ] && [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ] && drop=yes
drop_caches() { sync; echo 1 >/proc/sys/vm/drop_caches; }
load() { cut -d' ' -f1 /proc/loadavg; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); cores: $(nproc) (4 ranks oversubscribe 2 cores); memory: $(free -g | awk '/^Mem/ { print $2 }') GiB;" \
     "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: Linear($hidden, $hidden) + ReLU x $layers, AdamW (model + exp_avg + exp_avg_sq in each save); 1 thread a rank;" \
     "files in $dir ($(df -T "$dir" | awk 'NR == 2 { print $2 " on " $1 }'))"

# The disk's own rates, in DIR, as dd reports them (bytes / seconds).
ddfile="$dir/cpprun_dd_$$"
trap 'rm -f "$ddfile"' EXIT
dd_gbps() { sed -n 's/^\([0-9]*\) bytes.* copied, \([0-9.e+-]*\) s,.*/\1 \2/p' | awk '{ printf "%.3f", $1 / $2 / 1e9 }'; }
# Three times each: this VM's disk moves by several times from one minute to the next.
dd_writes=() dd_reads=()
for _ in 1 2 3; do
  dd_writes+=("$(dd if=/dev/zero of="$ddfile" bs=1M count="$dd_mb" conv=fdatasync 2>&1 | dd_gbps)")
  if [ "$drop" = yes ]; then
    drop_caches
    dd_reads+=("$(dd if="$ddfile" of=/dev/null bs=1M 2>&1 | dd_gbps)") read_how="after dropping the page cache"
  else
    dd_reads+=("$(dd if="$ddfile" of=/dev/null bs=1M iflag=direct 2>&1 | dd_gbps)")
    read_how="iflag=direct (the page cache is not dropped)"
  fi
  rm -f "$ddfile"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
dd_write=$(median <<<"${dd_writes[*]}") dd_read=$(median <<<"${dd_reads[*]}")
rm -f "$ddfile"
if [ -z "$dd_write" ] || [ -z "$dd_read" ]; then echo "bench: dd printed no rate" >&2; exit 1; fi
echo "disk (dd, $dd_mb MiB, median of 3): write $dd_write GB/s (conv=fdatasync; runs: ${dd_writes[*]})," \
     "read $dd_read GB/s ($read_how; runs: ${dd_reads[*]})"
if [ "$drop" = yes ]; then
  echo "loads read a cold page cache (rank 0 drops it before each load); saves fsync every file"
else
  echo "loads read a WARM page cache (not root, or BENCH_DROP_CACHES=0); saves fsync every file"
fi

# One run's RESULT line (rank 0's); a run that prints none stops the script, naming it.
result() {
  local label=$1 err line rc=0
  shift
  err=$(mktemp)
  line=$(tests/run_isolated.sh "$launcher" --standalone "$@" 2>"$err" | grep -m1 'RESULT ' | sed 's/^.*RESULT /RESULT /') ||
    rc=$?
  if [ -z "$line" ]; then
    echo "bench: $label printed no RESULT line; the end of its stderr:" >&2
    grep -v -e 'Failed to initialize NumPy' -e '_conversion_method_template' "$err" | tail -n 8 | sed 's/^/bench:   | /' >&2
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
  # A rank that dies in its teardown, after the RESULT line, leaves the figures good (see bench_common.sh).
  [ "$rc" = 0 ] || echo "bench: warning: $label exited with status $rc after its RESULT line" >&2
  echo "$line"
}
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }

printf '\n%-5s %-5s %-7s %6s %5s %7s %7s %7s %7s %7s %7s %8s %7s %8s %7s %7s %7s %5s %5s\n' ranks mode side GB cache \
  "save s" "GB/s" "/dd wr" "load s" "GB/s" "/dd rd" "async s" "/sync" "done s" "step s" "during" "/step" steps load
declare -A cpp_line=() py_line=()  # "=()": set, so that set -u takes an empty one (no PyTorch rows) as 0 long
raw=()
row() {  # RANKS MODE SIDE LINE LOAD
  local l=$4
  awk -v n="$1" -v m="$2" -v side="$3" -v load="$5" -v ddw="$dd_write" -v ddr="$dd_read" \
      -v b="$(field "$l" bytes)" -v cache="$(field "$l" cache)" -v s="$(field "$l" save_s)" -v sg="$(field "$l" save_gbps)" \
      -v ld="$(field "$l" load_s)" -v lg="$(field "$l" load_gbps)" -v ab="$(field "$l" async_block_s)" \
      -v ad="$(field "$l" async_done_s)" -v st="$(field "$l" step_s)" -v du="$(field "$l" during_step_s)" \
      -v k="$(field "$l" steps_during)" 'function ratio(a, b) { return b > 0 ? a / b : 0 } BEGIN {
    printf "%-5s %-5s %-7s %6.3f %5s %7.3f %7.3f %7.2f %7.3f %7.3f %7.2f %8.3f %7.3f %8.3f %7.3f %7.3f %7.2f %5d %5s\n",
           n, m, side, b / 1e9, cache, s, sg, ratio(sg, ddw), ld, lg, ratio(lg, ddr), ab, ratio(ab, s), ad, st, du,
           ratio(du, st), k, load }'
}
for n in $ranks; do
  for mode in $modes; do
    args=(--mode "$mode" --hidden "$hidden" --layers "$layers" --repeats "$repeats")
    [ "$drop" = yes ] && args+=(--drop-caches)
    before=$(load)
    line=$(result "cpprun $mode on $n ranks" --nproc_per_node="$n" "$prog" "${args[@]}" --dir "$dir/cpprun_ckpt_bench_$$/")
    grep -q ' roundtrip=ok' <<<"$line" || { echo "bench: cpprun $mode on $n ranks: the load did not give back the saved state: $line" >&2; exit 1; }
    cpp_line[$n.$mode]=$line raw+=("cpprun: $line")
    row "$n" "$mode" cpprun "$line" "$before-$(load)"
    if [[ " $py_ranks " == *" $n "* ]]; then
      before=$(load)
      line=$(result "PyTorch $mode on $n ranks" --nproc_per_node="$n" "$python" bench/checkpoint_bench.py "${args[@]}" \
               --dir "$dir/cpprun_ckpt_bench_py_$$/")
      py_line[$n.$mode]=$line raw+=("PyTorch: $line")
      row "$n" "$mode" PyTorch "$line" "$before-$(load)"
    fi
  done
done
echo "(GB: the files of one save; cache: whether the load read the disk (cold) or the page cache (warm);"
echo " save / load s: model + optimizer, between barriers (the slowest rank); /dd wr, /dd rd: the GB/s as a share of dd's;"
echo " async s: how long save_async (PyTorch: dcp.async_save) blocks the training thread, /sync: against the synchronous save;"
echo " done s: from the call until the save is on disk on every rank; step s: a training step with no save in flight;"
echo " during: a step while the background save writes, over 'steps' steps; load: uptime's 1-minute load before-after the run."
echo " On $(nproc) cores training already fills the cores, so the background write takes its CPU from the steps it spans.)"

if [ ${#py_line[@]} -gt 0 ]; then
  printf '\ncpprun against PyTorch (torch.distributed.checkpoint), PyTorch time / cpprun time (above 1: cpprun is faster):\n'
  printf '%-5s %-5s %7s %7s %10s %10s\n' ranks mode save load "async call" "async done"
  for key in "${!py_line[@]}"; do
    c=${cpp_line[$key]} p=${py_line[$key]}
    awk -v n="${key%%.*}" -v m="${key#*.}" -v cs="$(field "$c" save_s)" -v ps="$(field "$p" save_s)" \
        -v cl="$(field "$c" load_s)" -v pl="$(field "$p" load_s)" -v cb="$(field "$c" async_block_s)" \
        -v pb="$(field "$p" async_block_s)" -v cd="$(field "$c" async_done_s)" -v pd="$(field "$p" async_done_s)" \
        'function ratio(a, b) { return b > 0 ? a / b : 0 }
        BEGIN { printf "%-5s %-5s %7.2f %7.2f %10.2f %10.2f\n", n, m, ratio(ps, cs), ratio(pl, cl), ratio(pb, cb), ratio(pd, cd) }'
  done | sort
fi
printf '\nEach run, rank 0'"'"'s RESULT line (seconds; save_cpu_s, load_cpu_s: rank 0'"'"'s process CPU time, every thread):\n'
printf '%s\n' "${raw[@]}"
