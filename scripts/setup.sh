#!/usr/bin/env bash
# Installs everything cpprun needs to build and test on Debian 12. Idempotent, non-interactive;
# the Debian packages need root (or sudo).
#
#   bash scripts/setup.sh                      Debian packages + PyTorch's wheel (pinned below) in
#                                              .venv/: its LibTorch is what scripts/build.sh uses
#   bash scripts/setup.sh --libtorch DIR       use a LibTorch 2.x you already have, and download
#                                              no PyTorch. DIR holds share/cmake/Torch: the folder
#                                              unzipped from pytorch.org (libtorch/), or a pip or
#                                              conda install's torch/ (python3 -c 'import torch,
#                                              os; print(os.path.dirname(torch.__file__))').
#                                              Remembered in .libtorch; later runs need no flag.
#   bash scripts/setup.sh --use-wheel          forget a remembered --libtorch
set -euo pipefail
cd "$(dirname "$0")/.."

torch_version=2.15.0   # the newest torch on the index that installs here; CI builds this one
transformers_version=5.24.0  # tests only (train_gpt's GPT-2 interop); works with torch 2.15
venv=.venv
remembered=.libtorch

case "${1:-}" in
  --libtorch)
    dir=${2:?"setup: --libtorch needs a directory, e.g. --libtorch ~/libtorch"}
    dir=$(cd "$dir" 2>/dev/null && pwd) || { echo "setup: --libtorch $2: no such directory" >&2; exit 1; }
    [ -f "$dir/share/cmake/Torch/TorchConfig.cmake" ] || {
      echo "setup: --libtorch $dir has no share/cmake/Torch/TorchConfig.cmake; give the libtorch/ folder" \
           "of the pytorch.org zip, or the torch/ folder of a pip or conda install" >&2; exit 1; }
    echo "$dir" >"$remembered"
    echo "setup: will build against the LibTorch in $dir (remembered in $remembered)" ;;
  --use-wheel) rm -f "$remembered" ;;
  "") ;;
  *) echo "setup: unknown option '$1' (expected --libtorch DIR or --use-wheel)" >&2; exit 1 ;;
esac

# ---- Debian packages ----------------------------------------------------------------------
packages=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev                       # Gloo's headers: c10d's Gloo header needs them, no LibTorch ships them
  libcli11-dev catch2               # launcher CLI; tests
  libssl-dev                        # libcrypto's HMAC-SHA-256: multi-node agents prove the job secret
  iproute2 util-linux procps        # ip + unshare: tests run in private network namespaces; pgrep
  python3-venv                      # the project's .venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: [1/2] Debian packages: all ${#packages[@]} present"
else
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root, or install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup: [1/2] Debian packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- LibTorch -----------------------------------------------------------------------------
if [ -f "$remembered" ]; then
  echo "setup: [2/2] LibTorch: yours, at $(cat "$remembered") (nothing downloaded)"
  exit 0
fi
# The interpreter the venv is made from: python3 on PATH, or $CPPRUN_PYTHON.
python=${CPPRUN_PYTHON:-python3}
# Complete when torch is this version and the test dependencies (numpy, safetensors, transformers) import.
venv_check='import numpy, safetensors, transformers, importlib.metadata as m; print(m.version("torch"))'
if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c "$venv_check" 2>/dev/null)" = "$torch_version" ]; then
  echo "setup: [2/2] LibTorch: torch $torch_version present in $venv"
  exit 0
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if "$venv/bin/python" -c 'import importlib.metadata as m; m.version("torch")' 2>/dev/null; then
  echo "setup: [2/2] LibTorch: completing $venv (torch==$torch_version, numpy, safetensors, transformers)"
else
  echo "setup: [2/2] LibTorch: downloading PyTorch's wheel torch==$torch_version with its CUDA" \
       "libraries into $venv (about 3.2 GB to download, 5.3 GB installed; a few minutes)"
fi
start=$SECONDS
"$venv/bin/python" -m pip install --progress-bar off --disable-pip-version-check \
    "torch==$torch_version" numpy safetensors "transformers==$transformers_version" |
  grep --line-buffered -E '^(  Downloading|Successfully installed|ERROR)' | sed -u 's/^  /setup:   /'
"$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$torch_version')" ||
  { echo "setup: torch $torch_version did not install into $venv" >&2; exit 1; }
echo "setup: $venv ready in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1) in $venv)"
