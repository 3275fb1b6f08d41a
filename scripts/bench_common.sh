# Sourced by scripts/bench_ddp.sh and bench_fsdp.sh: set-up (with python3-torch), build, the BLAS
# line every benchmark prints, and run_dp IMPL MODE HIDDEN STEPS [FLAG...], which prints one
# configuration's wall ms/step (IMPL cpp: bench/dp_bench; py: bench/dp_bench.py) on 2 ranks under
# cpprun; run_dp_with_cpu prints the wall ms/step and then the CPU ms/step of rank 0's process.
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench >/dev/null
bash scripts/build.sh >/dev/null
build=${CPPRUN_BUILD_DIR:-build}
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
echo "BLAS: ${blas:-unknown}; cores: $(nproc); LibTorch (C++) and torch (Python): 1.13"

run_dp_with_cpu() {
  local impl=$1 mode=$2 hidden=$3 steps=$4 prog
  shift 4
  if [ "$impl" = cpp ]; then prog=("$build/bench/dp_bench"); else prog=(/usr/bin/python3 bench/dp_bench.py); fi
  tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=2 "${prog[@]}" \
      --mode "$mode" --hidden "$hidden" --steps "$steps" --warmup 3 "$@" 2>/dev/null |
    sed -n 's/.* ms_per_step=\([0-9.]*\) cpu_ms_per_step=\([0-9.]*\).*/\1 \2/p'
}

run_dp() { run_dp_with_cpu "$@" | cut -d' ' -f1; }
