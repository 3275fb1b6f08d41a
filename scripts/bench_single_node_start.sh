#!/usr/bin/env bash
# A single-node job's start once its Python ranks have imported torch: `--standalone
# --nproc_per_node=N` under cpprun and under torchrun, each rank running init_process_group("gloo")
# (env://) and one barrier (scripts/bench_single_node_start.py). Prints, per job, the time from the
# last rank's `import torch` to the last rank's barrier, and the medians and their ratio. Under
# both launchers the agent hosts the workers' c10d store before they start (cpprun's through its
# store keeper); a cpprun before the keeper had rank 0 host it (as env:// does without an agent
# store), so a rank whose import ended first connected before rank 0 had bound it and waited out
# c10d's own connect retry (about 500 ms): run this script of an older build's tree to see it. Runs
# in a private network namespace (tests/run_isolated.sh) where it can: torchrun's store, and a
# Python rank 0's, listen on every interface.
#   usage: scripts/bench_single_node_start.sh [REPEATS]   (default 8 jobs per launcher)
# Environment: BENCH_PYTHON (default $CPPRUN_TORCH_PYTHON, else .venv/bin/python; its torchrun is
# the one beside it), BENCH_START_RANKS (default 4); CPPRUN_BUILD_DIR as for scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-8}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [REPEATS]   (a positive number; default 8)" >&2; exit 2; }
python=${BENCH_PYTHON:-${CPPRUN_TORCH_PYTHON:-.venv/bin/python}}
torchrun=$(dirname "$python")/torchrun
cpprun=${CPPRUN_BUILD_DIR:-build}/launcher/cpprun
ranks=${BENCH_START_RANKS:-4}
if [ -z "${BENCH_START_ISOLATED:-}" ]; then
  [ -x "$cpprun" ] || { echo "bench_single_node_start: no $cpprun: build it first (scripts/build.sh)" >&2; exit 1; }
  [ -x "$torchrun" ] || { echo "bench_single_node_start: no torchrun beside $python (set BENCH_PYTHON)" >&2; exit 1; }
  BENCH_START_ISOLATED=1 exec tests/run_isolated.sh bash "$0" "$@"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

job() {  # LAUNCHER N: one job; prints its "last import -> last barrier" in seconds
  local out=$work/$1.$2
  mkdir -p "$out"
  # cpprun runs any program (the interpreter named); torchrun runs a Python script itself.
  local launch=("$cpprun" --standalone --nproc_per_node="$ranks" "$python")
  [ "$1" = torchrun ] && launch=("$torchrun" --standalone --nproc_per_node="$ranks")
  BENCH_START_OUT=$out timeout -k 5 120 "${launch[@]}" scripts/bench_single_node_start.py >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; echo "bench_single_node_start: a $1 job failed" >&2; exit 1; }
  local written=("$out"/rank.*)
  [ "${#written[@]}" = "$ranks" ] || { echo "bench_single_node_start: a $1 job lost a rank" >&2; exit 1; }
  awk '{ if ($2 > last_import) last_import = $2; if ($3 > last_done) last_done = $3 }
       END { printf "%.3f\n", last_done - last_import }' "$out"/rank.*
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
job cpprun warmup >/dev/null  # the first job after a build pays for cold page caches
for ((n = 0; n < repeats; ++n)); do
  job cpprun "$n" >>"$work/cpprun.times"
  job torchrun "$n" >>"$work/torchrun.times"
done
echo "$ranks Python ranks, --standalone, $(getconf _NPROCESSORS_ONLN) cores: the last import to the last barrier, s:"
for launcher in cpprun torchrun; do
  printf '%-9s %s   median %s\n' "$launcher" "$(tr '\n' ' ' <"$work/$launcher.times")" "$(median <"$work/$launcher.times")"
done
awk -v a="$(median <"$work/cpprun.times")" -v b="$(median <"$work/torchrun.times")" \
  'BEGIN { printf "cpprun - torchrun: %+.0f ms (medians)\n", (a - b) * 1000 }'
