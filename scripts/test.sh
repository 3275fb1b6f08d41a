#!/usr/bin/env bash
# The README's test command: set-up, configure, build, and every test (unit, multi-rank under
# cpprun, launcher, installed-package consumer, examples), then the verdict on skips. Says which
# stage it is in as it goes. Arguments go to ctest (e.g. -L quick, -R fsdp).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build_dir=${CPPRUN_BUILD_DIR:-build}
echo "test: [1/5] set-up (Debian packages, PyTorch's LibTorch)"
bash scripts/setup.sh
echo "test: [2/5] build"
CPPRUN_BUILD_TARGETS='' bash scripts/build.sh   # everything, whatever the environment says
echo "test: set-up + build took $(( $(date +%s) - start )) s"
count=$(ctest --test-dir "$build_dir" -N "$@" | sed -n 's/^Total Tests: //p')
echo "test: [3/5] ctest: $count tests, $(nproc) at a time (all of them: about 22 minutes on 2 cores;" \
     "-L quick: about 3); each line is one test done"
junit=$(cd "$build_dir" && pwd)/ctest-junit.xml
rm -f "$junit"
status=0
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)" --output-junit "$junit" "$@" || status=$?
# ctest counts a skip (exit 77) as a pass: only gpu-labelled tests may skip here.
echo "test: [4/5] verdict on skips (only tests labelled gpu may skip)"
python3 scripts/ctest_verdict.py "$build_dir" "$junit" || status=1
# Not a ctest: it would hold both cores for about 5 minutes. See Note [Catch2's CHECK against c10's].
if [ $# -eq 0 ]; then
  echo "test: [5/5] every test source compiles without the precompiled header (about 2.5 minutes)"
  bash scripts/check_no_pch.sh "$build_dir" || status=1
else
  echo "test: [5/5] skipped with ctest arguments: bash scripts/check_no_pch.sh compiles the tests without the PCH"
fi
echo "test: set-up + build + tests took $(( $(date +%s) - start )) s"
exit "$status"
