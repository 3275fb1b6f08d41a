#!/usr/bin/env bash
# Configures and builds cpprun in build/ (or $CPPRUN_BUILD_DIR). Extra arguments go to cmake's
# configure step, e.g. -DCMAKE_PREFIX_PATH=... for another LibTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${CPPRUN_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && [ ! -f "$build_dir/CMakeCache.txt" ] && generator=(-G Ninja)
cmake -S . -B "$build_dir" "${generator[@]}" "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
