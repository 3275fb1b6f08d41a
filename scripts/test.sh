#!/usr/bin/env bash
# The README's test command: set-up, configure, build, and every test (unit, multi-rank under
# cpprun, launcher, installed-package consumer, examples). Says which stage it is in as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
echo "test: [1/3] set-up (Debian packages, PyTorch's LibTorch)"
bash scripts/setup.sh
echo "test: [2/3] build"
CPPRUN_BUILD_TARGETS= bash scripts/build.sh   # everything, whatever the environment says
echo "test: set-up + build took $(( $(date +%s) - start )) s"
echo "test: [3/3] ctest (about 110 tests, 5-6 minutes on 2 cores; each line is one test done)"
ctest --test-dir "${CPPRUN_BUILD_DIR:-build}" --output-on-failure --parallel 2 "$@"
echo "test: set-up + build + tests took $(( $(date +%s) - start )) s"
