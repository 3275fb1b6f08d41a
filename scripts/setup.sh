#!/usr/bin/env bash
# Installs everything cpprun needs to build and test on Debian 12. Idempotent, non-interactive;
# needs root (or sudo). Does nothing when all packages are already there. With --bench, also
# what the benchmarks compare against (Debian's python3-torch).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev          # LibTorch 1.13 (CPU) with c10d; Gloo's headers for c10d's Gloo group
  libopenblas0-openmp               # without it libtorch runs on the reference BLAS, 18x slower
  libcli11-dev catch2               # launcher CLI; tests
  iproute2 util-linux procps        # ip + unshare: tests run in private network namespaces; pgrep
)

# Benchmarks also compare against PyTorch's own Python stack.
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup: run as root, or install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
