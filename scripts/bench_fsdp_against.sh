#!/usr/bin/env bash
# This build's DDP and ZeRO-1/2/3 against another build of cpprun (e.g. an earlier commit's), the
# runs alternating so that a slow minute on a shared machine does not land on one side only:
# ms per step (median of REPEATS runs), and this build's time over the other's. The same
# benchmark as scripts/bench_fsdp.sh's C++ side (bench/dp_bench: MLP 1024-[H x 4]-10, SGD with
# momentum, one unit per Linear, 64 samples per rank, 1 thread per rank).
#   usage: scripts/bench_fsdp_against.sh OTHER_BUILD_DIR [ranks] [repeats] [hidden]
#   e.g.   git worktree add /tmp/old de8d744 && (cd /tmp/old && bash scripts/build.sh) &&
#          BENCH_NO_SETUP=1 bash scripts/bench_fsdp_against.sh /tmp/old/build 4 5
set -euo pipefail
other=${1:?usage: scripts/bench_fsdp_against.sh OTHER_BUILD_DIR [ranks] [repeats] [hidden]}
[ -x "$other/bench/dp_bench" ] || { echo "bench: $other/bench/dp_bench does not exist (build it first)" >&2; exit 1; }
other=$(cd "$other" && pwd)
source "$(dirname "$0")/bench_common.sh"
BENCH_NPROC=${2:-4}
repeats=${3:-5}
hidden=${4:-2720}
steps=10
this=$build
echo "ranks $BENCH_NPROC, H=$hidden, $steps timed steps, median of $repeats; this build: $this, other: $other"
printf '%-6s %12s %12s %10s\n' mode "this ms" "other ms" "this/other"
for mode in ddp zero1 zero2 zero3; do
  mine="" theirs=""
  for ((r = 1; r <= repeats; ++r)); do
    build=$this; mine+=" $(run_dp cpp "$mode" "$hidden" "$steps")"
    build=$other; theirs+=" $(run_dp cpp "$mode" "$hidden" "$steps")"
  done
  build=$this
  a=$(median <<<"$mine") b=$(median <<<"$theirs")
  awk -v m="$mode" -v a="$a" -v b="$b" 'BEGIN { printf "%-6s %12.1f %12.1f %10.3f\n", m, a, b, a / b }'
done
