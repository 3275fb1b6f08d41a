#!/usr/bin/env bash
# scripts/gpu_check.sh --dry-run walks every stage without a GPU, build or PyTorch: it exits 0, each
# stage shows at least one command, the commands name the paths and flags the real run uses, and
# the Markdown report has every stage's section. The stages are listed here, not read from the
# script, so that a stage dropped by mistake fails this test.
#   usage: gpu_check_dry_run.sh REPO_ROOT
set -u
repo=$1
out=$(mktemp -d /tmp/cpprun_gpu_check_dry.XXXXXX)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$out/stdout"; exit 1; }

OUT=$out/logs BENCH_PYTHON=/nonexistent/python3 bash "$repo/scripts/gpu_check.sh" --dry-run >"$out/stdout" 2>&1 \
  || fail "gpu_check.sh --dry-run exited $?"
for stage in build test bench smoke gpt shared ncclfr gpt2 compare goals asan; do
  grep -q "^gpu_check: \[$stage\] would run: " "$out/stdout" || fail "stage $stage showed no command"
  grep -q "^### $stage\$" "$out/logs/gpu_run.md" || fail "gpu_run.md has no section for stage $stage"
done
# A few of the real commands, with their flags, as the real run would give them.
for expected in 'bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release' \
                'ctest --test-dir build-gpu --parallel [0-9]+ --label-exclude gpu' \
                '--nproc_per_node=4 build-gpu/bench/dp_bench --mode zero3 --device cuda:0' \
                '-DCMAKE_CXX_FLAGS=-fsanitize=address' \
                'ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:alloc_dealloc_mismatch=0' \
                'build-asan/tests/cpprun_dist_hsdp hsdp:' \
                '--layers 12 --embed 768 --heads 12 --block 1024' \
                'BENCH_DEVICE=cuda timeout 300 bash scripts/bench_gpt.sh --gpt2' \
                '--amp bf16 --mode none --attention math --optimizer libtorch' \
                'bash scripts/bench_adamw.sh --device cuda' \
                'bench_gpt.sh --gpt2 --batch 32 --rows cpprun-none\\,cpprun-graph' \
                'bench/trace_kernels.py [^ ]*/traces/cpprun.none.json [^ ]*/traces/cpprun.zero3.json'; do
  grep -q -E -e "$expected" "$out/stdout" || fail "no command matches '$expected'"
done
grep -q '^# The latest gpu_check run' "$out/logs/gpu_run.md" || fail "gpu_run.md has no title"
grep -q '^## .*(dry run: nothing ran)' "$out/logs/gpu_run.md" || fail "gpu_run.md does not say it is a dry run"
# Nothing ran: no build directory appeared, and an unknown stage is refused, naming the stages.
[ ! -e "$out/logs/build.log" ] || fail "the dry run wrote build.log: something ran"
if bash "$repo/scripts/gpu_check.sh" --dry-run nosuch >"$out/bad" 2>&1; then fail "an unknown stage was accepted"; fi
grep -q "no stage 'nosuch'; the stages are: build" "$out/bad" || fail "unknown stage: $(cat "$out/bad")"
echo "PASS: gpu_check.sh --dry-run walks $(grep -c 'would run: ' "$out/stdout") commands in 11 stages"
