#!/usr/bin/env bash
# Launcher overhead: wall time of cpprun against torchrun (PyTorch 2.15's, from the project's
# .venv: `.venv/bin/python -m torch.distributed.run`, or $BENCH_PYTHON's), both launching
# /bin/true, so the figures are the launchers' own cost:
#   1. --nproc_per_node=2                 2. --nproc_per_node=4
#   3. two nodes on loopback with c10d rendezvous: two launchers started at once, each
#      --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT
#      --rdzv_id=bench; timed from starting both until both have exited; a fresh free port
#      (29700-29799, none listening there) each run.
#   4. 8 and 32 nodes on loopback with the static backend: 8 (32) launchers started at once, each
#      --nnodes=N --node_rank=I --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=PORT; timed
#      until all have exited. What a many-node static job pays per node, here all on 2 cores.
#   5. --nproc_per_node=4 of a Python script that imports torch and exits (`cpprun x.py` runs it
#      with PYTHON_EXEC=$BENCH_PYTHON, torchrun with its own interpreter): what a Python user waits.
# One warm-up run of each launcher per case, then REPEATS runs (the 32-node case: at most 3, since
# torchrun's takes about a minute a run here), cpprun and torchrun alternating; prints the medians and
# torchrun/cpprun. The project's target is cpprun at most 1/100 of torchrun's wall time, i.e. a
# ratio of 100x or more.
#   usage: scripts/bench_launcher.sh [REPEATS]   (default 5)
# BENCH_LAUNCHER_CASES picks cases (default "2 4 c10d static8 static32 python").
# Environment: BENCH_PYTHON, the python3 whose torch's torchrun is measured (default
# .venv/bin/python); CPPRUN_BUILD_DIR as for scripts/build.sh. Runs scripts/setup.sh when the
# venv is missing and scripts/build.sh when cpprun is; it never rebuilds an existing cpprun.
#
# Settings: both launchers at their defaults. torchrun needs no --monitor_interval any more: 2.15's
# default is 0.1 s (1.13's was 5 s, so every run took 5 s unless one passed
# --monitor_interval=0.1), and cpprun reacts to worker exits at once. Nor does its c10d case need
# anything: with --nnodes=2 (MIN = MAX) its rendezvous completes as soon as the second agent
# joins, as cpprun's does (cpprun's last_call_timeout applies only below MAX), and its exit
# barrier returns as soon as both agents are done. Both get OMP_NUM_THREADS=1 (keeps both
# launchers' notice about it out) and TMPDIR inside this script's scratch dir, which it removes:
# torchrun would otherwise leave a /tmp/torchelastic_* dir per run.
# Runs in a private network namespace when it can (tests/run_isolated.sh, as the tests do), so
# the stores both launchers open (which listen on all interfaces) stay private; timing happens
# inside it. Every launcher runs under `timeout -k 5 60`; on exit or interruption, any still running
# are stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [REPEATS]   (a positive number; default 5)" >&2; exit 2; }
build=${CPPRUN_BUILD_DIR:-build}
cpprun=$build/launcher/cpprun
python=${BENCH_PYTHON:-.venv/bin/python}

if [ -z "${CPPRUN_BENCH_ISOLATED:-}" ]; then
  if [ ! -x .venv/bin/python ] && { [ -z "${BENCH_PYTHON:-}" ] || [ ! -x "$cpprun" ]; }; then
    bash scripts/setup.sh >&2
  fi
  [ -x "$cpprun" ] || bash scripts/build.sh >&2
  [ -x "$cpprun" ] || { echo "bench_launcher: no $cpprun after scripts/build.sh" >&2; exit 1; }
  "$python" -c 'import torch.distributed.run' >/dev/null 2>&1 ||
    { echo "bench_launcher: $python has no torch.distributed.run (set BENCH_PYTHON?)" >&2; exit 1; }
  CPPRUN_BENCH_ISOLATED=1 exec tests/run_isolated.sh bash "$0" "$@"
fi

cores=$(getconf _NPROCESSORS_ONLN)  # before OMP_NUM_THREADS=1, which GNU nproc would report
torch_version=$("$python" -c 'import importlib.util as u, os, runpy, platform
d = u.find_spec("torch").submodule_search_locations[0]
print(runpy.run_path(os.path.join(d, "version.py"))["__version__"], "on Python", platform.python_version())')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit+=" + uncommitted changes"
if [ -e /proc/self/ns/net ] && [ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net 2>/dev/null)" ]; then
  network="a private network namespace"
else
  network="the host's network (loopback)"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench_launcher.XXXXXX")
echo "import torch" >"$scratch/import_torch.py"
export TMPDIR=$scratch OMP_NUM_THREADS=1
running=()  # pids of the `timeout` processes now running; each leads a process group of its own

stop_running() {
  local p
  ((${#running[@]})) || return 0
  # timeout passes SIGTERM on to its launcher (and that one's group), and SIGKILL 5 s later (-k 5)
  for p in "${running[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait "${running[@]}" 2>/dev/null || true
  for p in "${running[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done  # any stragglers
  running=()
}
trap 'stop_running; rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

next_port=29700
# Sets port to the next port of 29700-29799 on which nothing listens.
pick_port() {
  local i
  for ((i = 0; i < 100; i++)); do
    port=$next_port
    next_port=$((29700 + (next_port - 29700 + 1) % 100))
    [ -z "$(ss -Hltn "sport = :$port")" ] && return 0
  done
  echo "bench_launcher: every port of 29700-29799 is in use" >&2
  exit 1
}

# cpprun's agents authenticate each other with the job secret (torchrun's do not); that cost is in
# the c10d figures.
export CPPRUN_JOB_SECRET=bench-launcher-$$-$RANDOM$RANDOM

# run_once LAUNCHER CASE: one run; sets ms to its wall time. LAUNCHER: cpprun or torchrun;
# CASE: 2 or 4 (workers on one node), c10d (two nodes), staticN (N nodes). Stops the script if a
# launcher fails.
run_once() {
  local launcher=() args=() nodes=1 i rc=0 start end rank_arg=() limit=60
  if [ "$1" = cpprun ]; then launcher=("$cpprun"); else launcher=("$python" -m torch.distributed.run); fi
  local program=/bin/true
  case $2 in
    c10d)
      pick_port
      nodes=2
      args=(--nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" --rdzv_id=bench) ;;
    static*)
      pick_port
      nodes=${2#static}
      limit=300
      args=(--nnodes="$nodes" --nproc_per_node=1 --master_addr=127.0.0.1 --master_port="$port") ;;
    python) args=(--nproc_per_node=4); program=$scratch/import_torch.py ;;
    *) args=(--nproc_per_node="$2") ;;
  esac
  [ "$1" = torchrun ] && [ "$program" = /bin/true ] && args+=(--no_python)
  start=$EPOCHREALTIME
  for ((i = 0; i < nodes; i++)); do
    rank_arg=()
    [[ $2 == static* ]] && rank_arg=(--node_rank="$i")
    PYTHON_EXEC=$python timeout -k 5 "$limit" "${launcher[@]}" "${args[@]}" "${rank_arg[@]}" "$program" \
      >"$scratch/node$i.log" 2>&1 &
    running+=($!)
  done
  for i in "${!running[@]}"; do wait "${running[$i]}" || rc=$?; done
  end=$EPOCHREALTIME
  running=()
  if ((rc)); then
    echo "bench_launcher: failed (exit $rc$( ((rc == 124)) && echo ", timed out")): ${launcher[*]} ${args[*]} $program" \
         "$( ((nodes > 1)) && echo "(on each of $nodes nodes)")" >&2
    for ((i = 0; i < nodes; i++)); do sed "s/^/  node $i: /" "$scratch/node$i.log" >&2; done
    exit 1
  fi
  ms=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", (b - a) * 1000 }')
}

median() { printf '%s\n' "$@" | sort -g | awk '{ t[NR] = $1 } END { print (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }'; }

echo "cpprun ($cpprun, commit $commit, built $(date -r "$cpprun" '+%F %T')) vs torchrun of torch" \
     "$torch_version ($python); cores: $cores"
# Other work on the machine shows up directly in cpprun's few milliseconds: look at the load.
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $network; both at their defaults (torchrun" \
     "2.15: --monitor_interval 0.1 s); $repeats runs each, alternating, after one warm-up each; medians"
echo "target: cpprun <= 1/100 of torchrun's wall time, i.e. torchrun/cpprun >= 100x"
printf '%-36s %11s %13s %16s %7s\n' case "cpprun ms" "torchrun ms" "torchrun/cpprun" target
for what in ${BENCH_LAUNCHER_CASES:-2 4 c10d static8 static32 python}; do
  runs=$repeats
  case $what in
    c10d) label="2 nodes x 1 worker, c10d, loopback" ;;
    static32) label="32 nodes x 1 worker, static, loopback"; ((runs > 3)) && runs=3 ;;
    static*)
      [[ ${what#static} =~ ^[1-9][0-9]*$ ]] || { echo "bench_launcher: '$what': staticN needs a number of nodes" >&2; exit 2; }
      label="${what#static} nodes x 1 worker, static, loopback" ;;
    python) label="4 workers of 'import torch' (Python)" ;;
    2 | 4) label="$what workers of /bin/true" ;;
    *) echo "bench_launcher: unknown case '$what' in BENCH_LAUNCHER_CASES (2 4 c10d staticN python)" >&2; exit 2 ;;
  esac
  run_once cpprun "$what"
  run_once torchrun "$what"
  c=() t=()
  for ((r = 0; r < runs; r++)); do
    run_once cpprun "$what"; c+=("$ms")
    run_once torchrun "$what"; t+=("$ms")
  done
  # The Python case is mostly the workers' own `import torch`: no launcher target applies to it.
  awk -v l="$label" -v c="$(median "${c[@]}")" -v t="$(median "${t[@]}")" -v py="$([ "$what" = python ] && echo 1)" 'BEGIN {
    printf "%-36s %11.2f %13.1f %15.2fx %7s\n", l, c, t, t / c, py ? "n/a" : (t / c >= 100) ? "met" : "MISSED" }'
done
