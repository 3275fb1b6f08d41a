#!/usr/bin/env bash
# Configures and builds cpprun in build/ (or $CPPRUN_BUILD_DIR) against the LibTorch that
# scripts/setup.sh provided: a remembered --libtorch DIR, else the wheel in .venv/ ($CPPRUN_LIBTORCH
# overrides both for one build). Extra arguments go to cmake's configure step (e.g.
# -DCMAKE_BUILD_TYPE=Release). CPPRUN_BUILD_TARGETS="cpprun train_mnist" builds only those targets
# (and what they link), as scripts/demo.sh does; unset, everything is built.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${CPPRUN_BUILD_DIR:-build}

if [ -n "${CPPRUN_LIBTORCH:-}" ]; then
  torch_prefix=$CPPRUN_LIBTORCH
elif [ -f .libtorch ]; then
  torch_prefix=$(cat .libtorch)
elif [ -x .venv/bin/python ]; then
  torch_prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null | tail -1)
else
  echo "build: no LibTorch yet: run bash scripts/setup.sh first (or setup.sh --libtorch DIR)" >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null && [ ! -f "$build_dir/CMakeCache.txt" ] && generator=(-G Ninja)
echo "build: configuring $build_dir against $torch_prefix"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_PREFIX_PATH="$torch_prefix" "$@" >"$log" 2>&1; then
  grep -E '^-- cpprun:' "$log" | sed 's/^-- /build: /'
else
  cat "$log" >&2
  echo "build: configure failed (above: CMake's output)" >&2
  exit 1
fi
# One line a target, with how far along: "build [37/98] ..." (about 14 minutes from scratch on
# 2 cores; seconds when nothing changed).
targets=()
if [ -n "${CPPRUN_BUILD_TARGETS:-}" ]; then
  read -r -a targets <<<"$CPPRUN_BUILD_TARGETS"
  echo "build: compiling ${targets[*]} and what they link"
  targets=(--target "${targets[@]}")
else
  echo "build: compiling everything (a fresh build takes about 14 minutes on 2 cores)"
fi
NINJA_STATUS="build [%f/%t] " cmake --build "$build_dir" --parallel "$(nproc)" "${targets[@]}"
