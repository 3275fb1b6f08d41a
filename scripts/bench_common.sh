# Sourced by scripts/bench_ddp.sh and bench_fsdp.sh: set-up (PyTorch's wheel in .venv/, which
# also gives the C++ side its LibTorch), build, the line every benchmark prints first, and the
# helpers that run one configuration IMPL MODE HIDDEN STEPS [FLAG...] (IMPL cpp: bench/dp_bench;
# py: bench/dp_bench.py) under cpprun on BENCH_NPROC ranks:
#   dp_result        prints its RESULT line (rank 0's); a run that prints none stops here: a
#                    message naming the configuration and the end of its stderr, and status 1
#   run_dp_with_cpu  prints the wall ms/step and then the CPU ms/step of rank 0's process
#   run_dp           prints the wall ms/step
#   run_dp_ms_mem    prints the wall ms/step and then peak_rss_mb (rank 0's peak resident memory
#                    above its size before the model was built), status 1 when either is missing
#   median           the median of the numbers on its standard input (spaces or newlines)
# Environment: BENCH_NPROC ranks per run (default 2); BENCH_DEVICE=cuda runs both sides on GPUs
# (one per rank, NCCL); BENCH_PYTHON is the python with torch (default the project's
# .venv/bin/python, else python3); BENCH_NO_SETUP=1 skips set-up and build
# (scripts/gpu_check.sh builds for itself); CPPRUN_BUILD_DIR as for scripts/build.sh.
cd "$(dirname "$0")/.."
if [ "${BENCH_NO_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh >/dev/null
  bash scripts/build.sh >/dev/null
fi
build=${CPPRUN_BUILD_DIR:-build}
device=${BENCH_DEVICE:-cpu}
if [ -n "${BENCH_PYTHON:-}" ]; then
  python=$BENCH_PYTHON
elif [ -x .venv/bin/python ]; then
  python=$PWD/.venv/bin/python
else
  python=python3
fi
# Both sides run the venv torch's LibTorch, and with it the BLAS it carries.
torch_info=$("$python" -c "import torch; print(torch.__version__, torch.backends.mkl.is_available() and 'MKL' or 'other')" 2>/dev/null) ||
  torch_info="none unknown"
echo "device: $device; BLAS: ${torch_info#* }; cores: $(nproc); torch (Python): ${torch_info%% *}"

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

dp_result() {
  local impl=$1 mode=$2 hidden=$3 steps=$4 nproc=${BENCH_NPROC:-2} prog err out line rc=0 config
  shift 4
  if [ "$impl" = cpp ]; then prog=("$build/bench/dp_bench"); else prog=("$python" bench/dp_bench.py); fi
  config="$impl --mode $mode --hidden $hidden --steps $steps${*:+ $*} on $nproc ranks"
  err=$(mktemp)
  out=$(tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node="$nproc" "${prog[@]}" \
      --mode "$mode" --hidden "$hidden" --steps "$steps" --warmup 3 --device "$device" "$@" 2>"$err") || rc=$?
  line=$(grep -m1 'RESULT ' <<<"$out")
  if [ -z "$line" ]; then
    echo "bench: $config printed no RESULT line (exit status $rc); the end of its stderr:" >&2
    grep -v -e 'Failed to initialize NumPy' -e '_conversion_method_template' "$err" | tail -n 6 | sed 's/^/bench:   | /' >&2
    rm -f "$err"
    return 1
  fi
  # A rank that dies in its teardown, after the timed steps and the RESULT line, leaves the figure good.
  [ "$rc" = 0 ] || echo "bench: warning: $config exited with status $rc after its RESULT line (figure kept)" >&2
  rm -f "$err"
  echo "$line"
}

run_dp_with_cpu() {
  local line
  line=$(dp_result "$@") || return 1
  sed -n 's/.* ms_per_step=\([0-9.]*\) cpu_ms_per_step=\([0-9.]*\).*/\1 \2/p' <<<"$line"
}

run_dp() { local out; out=$(run_dp_with_cpu "$@") || return 1; echo "${out%% *}"; }

run_dp_ms_mem() {
  local line ms mem
  line=$(dp_result "$@") || return 1
  ms=$(sed -n 's/.* ms_per_step=\([0-9.]*\) .*/\1/p' <<<"$line")
  mem=$(sed -n 's/.* peak_rss_mb=\([0-9.]*\).*/\1/p' <<<"$line")
  if [ -z "$ms" ] || [ -z "$mem" ]; then
    echo "bench: $1 --mode $2 --hidden $3: its RESULT line has no ms_per_step or peak_rss_mb" \
         "(a $build/bench/dp_bench older than bench/dp_bench.cpp? run scripts/build.sh): $line" >&2
    return 1
  fi
  echo "$ms $mem"
}
