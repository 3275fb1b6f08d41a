#!/bin/sh
# A collective save that fails on a full disk removes what it wrote, on every rank: 2 ranks, the
# last one's file of each save written onto a tmpfs filled up (the test case "[.full_disk]" in
# test_optimizer_state_dict.cpp). A private mount namespace holds the tmpfs: root only; without
# it the test exits 77, which the verdict counts as a failure (CI runs as root).
# usage: full_disk_save.sh CPPRUN TEST_BINARY
set -eu
cpprun=$1 binary=$2
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "SKIP: needs root and unshare -m (a private mount namespace for a small tmpfs)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/full"
# shellcheck disable=SC2016
unshare -m sh -c '
  set -eu
  mount -t tmpfs -o size=64k tmpfs "$1/full"
  head -c 1M /dev/zero >"$1/full/filler" 2>/dev/null || true  # ENOSPC: the disk is full
  df -h "$1/full" | tail -1
  CPPRUN_FULL_DISK="$1/full" exec "$2" --standalone --nproc_per_node=2 "$3" "[.full_disk]"
' sh "$dir" "$cpprun" "$binary"
echo PASS
