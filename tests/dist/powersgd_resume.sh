#!/usr/bin/env bash
# PowerSGD's state through a checkpoint (save_powerSGD_state / load_powerSGD_state): DDP on 2 ranks
# trains a float64 MLP 8 steps, PowerSGD from step 3, under three configurations (rank 1
# warm-started; rank 3 by QR, cold: new random Q every step; rank 2 over four buckets); runs
# resumed after step 2 (before PowerSGD starts: the step count must carry the switch) and after
# step 5 (errors, P/Q and the random numbers in use) with a new model, DDP and hook end bitwise
# equal to the uninterrupted run, and resumed without the state they do not. Each rank's file
# holds what PyTorch's PowerSGDState holds after the same 5 steps, under its names (torch.load
# reads it); the same states re-saved by torch.save with strided tensors resume alike; files that do
# not fit are refused (one whose shapes are an expanded tensor, whose storage is smaller than its
# elements, among them).
# Usage: powersgd_resume.sh PROBE CPPRUN PYTHON. Skips (77) without a python with torch, numpy and safetensors.
set -u
probe=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch numpy safetensors.torch
export PYTHON_EXEC=$python  # the interpreter cpprun runs powersgd_resume.py with
py=$here/powersgd_resume.py
run2() { "$cpprun" --standalone --nproc_per_node=2 "$@"; }
"$python" "$py" init "$dir" || fail "Python could not write the parameters and batches"
for config in warm cold buckets; do
  run2 "$probe" full "$dir" "$config" || fail "the uninterrupted run ($config) failed"
  for k in 2 5; do
    run2 "$probe" resume "$dir" "$config" "$k" || fail "the run resumed after step $k ($config) failed"
    run2 "$probe" resume "$dir" "$config" "$k" nostate || fail "the run resumed without state ($config) failed"
  done
  "$python" "$py" compare "$dir" "$config" || fail "a resumed run ($config) trains otherwise than the uninterrupted one"
done
run2 "$py" pytorch "$dir" || fail "cpprun's PowerSGD state files differ from PyTorch's PowerSGDState"
"$python" "$py" craft "$dir" || fail "Python could not re-save the state files with strided tensors"
run2 "$probe" resume "$dir" warm 5 strided || fail "the run resumed from torch.save's strided state files failed"
"$python" "$py" compare_strided "$dir" || fail "a run resumed from strided state files trains otherwise"
run2 "$probe" refuse "$dir" || fail "a PowerSGD state that does not fit was not refused as it should be"
"$cpprun" --standalone --nproc_per_node=1 "$probe" refuse_world "$dir" ||
  fail "a PowerSGD state of world size 2 was not refused at world size 1"
echo "PASS"
