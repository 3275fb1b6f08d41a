#!/usr/bin/env bash
# Checks that tests/data/sampler_indices.txt is still what this PyTorch's DistributedSampler
# yields (the header line, naming the version, aside). Skips (77) without a python that has torch.
set -u
python=${1:-}
data=$(dirname "$0")/../data
if [ -z "$python" ] || ! "$python" -c 'import torch.utils.data.distributed' 2>/dev/null; then
  echo "SKIP: needs a python that imports torch (run scripts/setup.sh, or configure with -DCPPRUN_TORCH_PYTHON=...)"
  exit 77
fi
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
"$python" "$data/make_sampler_indices.py" 2>/dev/null >"$fresh" || { echo "FAIL: make_sampler_indices.py failed"; exit 1; }
if diff <(tail -n +2 "$data/sampler_indices.txt") <(tail -n +2 "$fresh") >/dev/null; then
  echo "PASS: $(($(wc -l <"$fresh") - 1)) index lists match $(head -1 "$fresh" | cut -d: -f1 | tr -d '#')"
else
  echo "FAIL: $(head -1 "$fresh" | cut -d: -f1 | tr -d '#') yields other indices than tests/data/sampler_indices.txt:"
  diff <(tail -n +2 "$data/sampler_indices.txt") <(tail -n +2 "$fresh") | head -5
  exit 1
fi
