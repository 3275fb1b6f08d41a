#!/usr/bin/env bash
# The README's test command: set-up, configure, build, and every test (unit, multi-rank under
# cpprun, launcher, installed-package consumer, examples).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
bash scripts/build.sh
echo "test: build took $(( $(date +%s) - start )) s"
ctest --test-dir "${CPPRUN_BUILD_DIR:-build}" --output-on-failure --parallel 2 "$@"
echo "test: set-up + build + tests took $(( $(date +%s) - start )) s"
