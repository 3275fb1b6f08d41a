#!/usr/bin/env bash
# Launcher overhead: wall time of `cpprun --standalone --nproc_per_node=N /bin/true` against Debian's
# torchrun (python3-torch 1.13, `python3 -m torch.distributed.run --no_python`) running the same,
# for N=2 and 4. Each is run RUNS times after one warm-up; prints the medians and their ratio.
# Runs in a private network namespace (tests/run_isolated.sh), like the tests, so both launchers'
# --standalone rendezvous stay private.
#   usage: scripts/bench_launcher.sh [RUNS]   (default 5)
#
# torchrun settings: --monitor_interval=0.1, so its agent notices the exits quickly (1.13's default
# of 5 s would make every run take 5 s: the agent polls the workers that often). Debian's torchrun crashes at
# its defaults on Python 3.11 ('NoneType' object has no attribute 'get'): Std.from_str maps
# --redirects/--tee values to Std members by iterating the IntFlag, which on 3.11 yields only
# single-bit members, so 0 (NONE) and 3 (ALL) become None. Work-around: a per-rank map naming a
# local rank that does not exist, `--redirects 9:1 --tee 9:1`; every real rank then gets Std.NONE,
# i.e. torchrun's default (output inherited, no files, no tail threads). --log_dir points into
# this script's temp dir, which it removes: torchrun would otherwise leave /tmp/torchelastic_*.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}

if [ -z "${CPPRUN_BENCH_ISOLATED:-}" ]; then
  if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
    echo "bench_launcher: installing python3-torch (Debian's torchrun)"
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
  fi
  build=${CPPRUN_BUILD_DIR:-build}
  [ -f "$build/CMakeCache.txt" ] || bash scripts/build.sh >/dev/null
  cmake --build "$build" --target cpprun >/dev/null
  # Timing happens inside one namespace, so unshare's own cost is not in the figures.
  CPPRUN_BENCH_ISOLATED=1 CPPRUN_BENCH_BIN=$build/launcher/cpprun exec tests/run_isolated.sh bash "$0" "$@"
fi

cpprun=$CPPRUN_BENCH_BIN
scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench_launcher.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export OMP_NUM_THREADS=1  # keeps both launchers' OMP notice out (and makes nproc say 1)

# Median wall time in ms of RUNS runs of the command (after one warm-up); fails if it fails.
median_ms() {
  local times=() i start
  "$@" >/dev/null 2>&1 || { echo "bench_launcher: failed: $*" >&2; "$@" >&2 || true; exit 1; }
  for ((i = 0; i < runs; i++)); do
    start=$EPOCHREALTIME
    "$@" >/dev/null 2>&1
    times+=("$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", (b - a) * 1000 }')")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{ t[NR] = $1 } END { print (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }'
}

# Other work on the machine shows up directly in cpprun's few milliseconds: look at the load.
echo "cores: $(getconf _NPROCESSORS_ONLN); load average: $(cut -d' ' -f1-3 /proc/loadavg); $runs runs each after a warm-up; medians"
printf '%-6s %14s %14s %10s\n' N "cpprun ms" "torchrun ms" "ratio"
for n in 2 4; do
  c=$(median_ms "$cpprun" --standalone --nproc_per_node="$n" /bin/true)
  t=$(median_ms /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
        --monitor_interval=0.1 --no_python --redirects 9:1 --tee 9:1 --log_dir "$scratch/torchrun" /bin/true)
  awk -v n="$n" -v c="$c" -v t="$t" 'BEGIN { printf "%-6s %14.2f %14.1f %9.0fx\n", n, c, t, t / c }'
done
