# Sourced by scripts/bench_ddp.sh and bench_fsdp.sh: set-up (with python3-torch), build, the
# line every benchmark prints first, and run_dp IMPL MODE HIDDEN STEPS [FLAG...], which prints
# one configuration's wall ms/step (IMPL cpp: bench/dp_bench; py: bench/dp_bench.py) on 2 ranks
# under cpprun; run_dp_with_cpu prints the wall ms/step and then the CPU ms/step of rank 0's
# process.
# Environment: BENCH_DEVICE=cuda runs both sides on GPUs (one per rank, NCCL); BENCH_PYTHON is
# the python3 with torch (default Debian's /usr/bin/python3); BENCH_NO_SETUP=1 skips set-up and
# build (scripts/gpu_check.sh builds for itself); CPPRUN_BUILD_DIR as for scripts/build.sh.
cd "$(dirname "$0")/.."
if [ "${BENCH_NO_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh --bench >/dev/null
  bash scripts/build.sh >/dev/null
fi
build=${CPPRUN_BUILD_DIR:-build}
device=${BENCH_DEVICE:-cpu}
python=${BENCH_PYTHON:-/usr/bin/python3}
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
echo "device: $device; BLAS: ${blas:-unknown}; cores: $(nproc); torch (Python): $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"

run_dp_with_cpu() {
  local impl=$1 mode=$2 hidden=$3 steps=$4 prog
  shift 4
  if [ "$impl" = cpp ]; then prog=("$build/bench/dp_bench"); else prog=("$python" bench/dp_bench.py); fi
  tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=2 "${prog[@]}" \
      --mode "$mode" --hidden "$hidden" --steps "$steps" --warmup 3 --device "$device" "$@" 2>/dev/null |
    sed -n 's/.* ms_per_step=\([0-9.]*\) cpu_ms_per_step=\([0-9.]*\).*/\1 \2/p'
}

run_dp() { run_dp_with_cpu "$@" | cut -d' ' -f1; }
