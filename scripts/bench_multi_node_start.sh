#!/usr/bin/env bash
# What the store tunnel costs a multi-node job's start: N cpprun agents on loopback (static
# rendezvous, --nnodes=N --node_rank=I --nproc_per_node=1 --master_addr=127.0.0.1), each with one
# Python rank that imports torch, connects to the c10d TCPStore as torch's env:// does (node 0's
# agent hosts it, its store keeper: TORCHELASTIC_USE_AGENT_STORE=True), builds Gloo's process group
# on it, runs one barrier and exits (scripts/bench_start_worker.py). Each job runs once with a job
# secret (ranks 1..N-1 reach node 0's store through their agent, the link and node 0's agent:
# docs/launcher.md, "Several nodes") and once with --no_job_secret (they connect to it directly), N = 4 and 8,
# tunnel and direct alternating, after one warm-up job. Prints, as medians of REPEATS jobs:
#   job wall      from starting the N agents to the last one's exit
#   ready         each rank's own time.perf_counter() from "import torch done" to "barrier done",
#                 the median and the max over the ranks (it includes waiting for the slowest rank's
#                 import: N interpreters import torch at once on this machine's cores)
#   after import  from the last rank's "import done" to the last rank's "barrier done": what is
#                 left of the start once every rank is ready, split into store (to the last TCPStore
#                 connection), group (init_process_group: Gloo's addresses through the store, its
#                 mesh directly) and barrier; with the longest a rank took to connect once the
#                 store could be there (connect lag max) and how many ranks tried before it was
#                 (early ranks: they wait out a connect retry, c10d's own or node 0's agent's).
#                 The store keeper's store is there before any rank starts; were rank 0 to host it
#                 (a cpprun before the keeper), it would be there once rank 0 had imported torch
# and tunnel/direct for each. Runs in a private network namespace whose only interface is the
# loopback when it can (tests/run_isolated.sh), since the store listens on every interface with
# --no_job_secret; every agent runs under `timeout -k 5 120`, and on exit or interruption any still
# running are stopped.
#   usage: scripts/bench_multi_node_start.sh [REPEATS]   (default 3)
# Environment: BENCH_PYTHON (default $CPPRUN_TORCH_PYTHON, else .venv/bin/python),
# BENCH_START_NODES (default "4 8"), BENCH_START_KEEP (a directory: each job's rank.R lines and agents'
# logs are copied there, one folder per job, to look into); CPPRUN_BUILD_DIR as for
# scripts/build.sh (it never builds).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [REPEATS]   (a positive number; default 3)" >&2; exit 2; }
python=${BENCH_PYTHON:-${CPPRUN_TORCH_PYTHON:-.venv/bin/python}}
cpprun=${CPPRUN_BUILD_DIR:-build}/launcher/cpprun
node_counts=${BENCH_START_NODES:-4 8}
for n in $node_counts; do
  [[ $n =~ ^[1-9][0-9]*$ && $n -ge 2 ]] ||
    { echo "bench_multi_node_start: BENCH_START_NODES='$node_counts': each must be a number of nodes >= 2" >&2; exit 2; }
done

if [ -z "${BENCH_START_ISOLATED:-}" ]; then
  [ -x "$cpprun" ] || { echo "bench_multi_node_start: no $cpprun: build it first (scripts/build.sh)" >&2; exit 1; }
  "$python" -c 'import torch.distributed' ||
    { echo "bench_multi_node_start: $python cannot import torch.distributed (set BENCH_PYTHON)" >&2; exit 1; }
  BENCH_START_ISOLATED=1 exec tests/run_isolated.sh bash "$0" "$@"
fi

cores=$(getconf _NPROCESSORS_ONLN)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net 2>/dev/null)" ]; then
  network="a private network namespace (loopback only)"
else
  network="the host's loopback"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_multi_node_start.XXXXXX")
export TMPDIR=$work OMP_NUM_THREADS=1
unset CPPRUN_JOB_SECRET
jobs_run=0
running=()  # pids of the `timeout`s now running, each leading its agent's process group

stop_running() {
  local p
  ((${#running[@]})) || return 0
  for p in "${running[@]}"; do kill -TERM "$p" 2>/dev/null || true; done  # timeout passes it on
  wait "${running[@]}" 2>/dev/null || true
  for p in "${running[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done  # any stragglers
  running=()
}
keep=${BENCH_START_KEEP:-}
[ -z "$keep" ] || mkdir -p "$keep"
trap 'stop_running; rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Sets port to a port of 29800-29899, starting at a random one, on which nothing listens.
pick_port() {
  local i first=$((RANDOM % 100))
  for ((i = 0; i < 100; i++)); do
    port=$((29800 + (first + i) % 100))
    [ -z "$(ss -Hltn "sport = :$port")" ] && return 0
  done
  echo "bench_multi_node_start: every port of 29800-29899 is in use" >&2
  exit 1
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# job MODE N RESULT: one job of N agents, MODE tunnel (a fresh job secret) or direct
# (--no_job_secret); appends "wall ready_median ready_max after_import store group barrier import
# connect_lag_max early_ranks" (seconds, but the count) to RESULT. Stops the script, with every
# agent's log, if the job fails.
job() {
  local mode=$1 n=$2 result=$3 out node rc=0 start end secret=() extra=()
  pick_port
  out=$(mktemp -d "$work/$mode.$n.XXXX")
  if [ "$mode" = tunnel ]; then
    secret=(CPPRUN_JOB_SECRET="bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')")
  else
    extra=(--no_job_secret)
  fi
  start=$EPOCHREALTIME
  for ((node = 0; node < n; node++)); do
    env "${secret[@]}" BENCH_START_OUT="$out" timeout -k 5 120 "$cpprun" --nnodes="$n" --node_rank="$node" \
      --nproc_per_node=1 --master_addr=127.0.0.1 --master_port="$port" "${extra[@]}" \
      "$python" scripts/bench_start_worker.py >"$out/node$node.log" 2>&1 &
    running+=($!)
  done
  for node in "${!running[@]}"; do wait "${running[$node]}" || rc=$?; done
  end=$EPOCHREALTIME
  running=()
  if ((rc)) || [ "$(cat "$out"/rank.* 2>/dev/null | wc -l)" != "$n" ]; then
    for ((node = 0; node < n; node++)); do sed "s/^/  node $node: /" "$out/node$node.log" >&2; done
    echo "bench_multi_node_start: the $mode job of $n nodes failed (exit $rc$( ((rc == 124)) && echo ", timed out"))," \
         "$(cat "$out"/rank.* 2>/dev/null | wc -l) of $n ranks reported; agents' logs above" >&2
    exit 1
  fi
  jobs_run=$((jobs_run + 1))
  [ -z "$keep" ] || cp -r "$out" "$keep/$(printf %02d "$jobs_run").${out##*/}"
  # rank.R: RANK started imported store_connected group_ready barrier_done ready_s
  cat "$out"/rank.* | awk -v wall="$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" '
    function median(v, k,   i, j, x) {  # sorts v[1..k] in place
      for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { x = v[j]; v[j] = v[j - 1]; v[j - 1] = x }
      return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
    }
    { rank[NR] = $1; for (c = 2; c <= 7; c++) t[NR, c] = $c + 0; if ($1 == 0) bound = ($8 == 1) ? 0 : $3 + 0 }
    END {
      for (r = 1; r <= NR; r++) {
        ready[r] = t[r, 7]; imports[r] = t[r, 3] - t[r, 2]
        for (c = 3; c <= 7; c++) if (r == 1 || t[r, c] > last[c]) last[c] = t[r, c]
        if (rank[r] == 0) continue
        lag = t[r, 4] - (t[r, 3] > bound ? t[r, 3] : bound)
        if (lag > lag_max) lag_max = lag
        if (t[r, 3] < bound) early++
      }
      printf "%.6f %.6f %.6f %.6f %.6f %.6f %.6f %.6f %.6f %d\n", wall, median(ready, NR), last[7], last[6] - last[3],
             last[4] - last[3], last[5] - last[4], last[6] - last[5], median(imports, NR), lag_max, early
    }' >>"$result"
}

echo "cpprun ($cpprun, commit $commit, built $(date -r "$cpprun" '+%F %T')); $python" \
     "($("$python" -c 'import torch; print("torch", torch.__version__)'))"
echo "cores: $cores; load average: $(cut -d' ' -f1-3 /proc/loadavg); $network; one Python rank per node:" \
     "N interpreters import torch at once on $cores cores, which is most of each job's wall time"
echo "$repeats jobs per mode and N, tunnel and direct alternating, after one warm-up job; medians"
job direct "${node_counts%% *}" "$work/warmup"
for ((r = 0; r < repeats; r++)); do
  for n in $node_counts; do
    if ((r % 2)); then order="direct tunnel"; else order="tunnel direct"; fi
    for mode in $order; do job "$mode" "$n" "$work/$mode.$n.jobs"; done
  done
done

# figure MODE N COLUMN: the median over the jobs of one column of $work/MODE.N.jobs
figure() { awk -v c="$3" '{ print $c }' "$work/$1.$2.jobs" | median; }
ratio() { awk -v t="$(figure tunnel "$1" "$2")" -v d="$(figure direct "$1" "$2")" 'BEGIN {
  if (d > 0) printf "%.2fx", t / d; else printf "n/a" }'; }
ms() { awk -v s="$(figure "$1" "$2" "$3")" 'BEGIN { printf "%.0f", s * 1000 }'; }
printf '%-17s %9s %11s %11s %13s %8s\n' "" "job wall" "ready med" "ready max" "after import" import
for n in $node_counts; do
  for mode in tunnel direct; do
    printf '%-17s %8.2fs %9sms %9sms %11sms %7.2fs\n' "$n nodes, $mode" "$(figure "$mode" "$n" 1)" \
           "$(ms "$mode" "$n" 2)" "$(ms "$mode" "$n" 3)" "$(ms "$mode" "$n" 4)" "$(figure "$mode" "$n" 8)"
  done
  printf '%-17s %9s %11s %11s %13s\n' "  tunnel/direct" "$(ratio "$n" 1)" "$(ratio "$n" 2)" "$(ratio "$n" 3)" "$(ratio "$n" 4)"
done
echo "after import, split:"
printf '%-17s %9s %17s %8s %8s %12s\n' "" store "connect lag max" group barrier "early ranks"
for n in $node_counts; do
  for mode in tunnel direct; do
    printf '%-17s %7sms %15sms %6sms %6sms %12s\n' "$n nodes, $mode" "$(ms "$mode" "$n" 5)" "$(ms "$mode" "$n" 9)" \
           "$(ms "$mode" "$n" 6)" "$(ms "$mode" "$n" 7)" "$(figure "$mode" "$n" 10)"
  done
  printf '%-17s %9s %17s %8s %8s\n' "  tunnel/direct" "$(ratio "$n" 5)" "$(ratio "$n" 9)" "$(ratio "$n" 6)" "$(ratio "$n" 7)"
done
echo "ready: each rank's time from \"import torch done\" to \"barrier done\" (median, max over the ranks);" \
     "after import: from the last rank's \"import done\" to the last \"barrier done\"; import: each rank's" \
     "import torch (median over the ranks). Split: store, to the last TCPStore connection (connect lag max: the" \
     "longest a rank took to connect after its own import, or after rank 0 had imported torch and bound the store" \
     "if rank 0 hosts it); group: init_process_group; barrier: dist.barrier; early ranks: how many ranks' first" \
     "connection came before a rank 0's store was bound (they wait out a connect retry: c10d's own, directly;" \
     "node 0's agent's, through the tunnel; none with the agent's store keeper)"
