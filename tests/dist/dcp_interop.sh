#!/usr/bin/env bash
# A PyTorch user's checkpoint reaches cpprun and back through scripts/dcp_convert.py: FSDP2 on 2
# ranks trains an MLP with AdamW (float64) and saves with torch.distributed.checkpoint in
# torchtitan's layout (each step two micro-batches, each backward reducing its gradients, which
# add up on both sides); to-cpprun converts it; cpprun's FSDP on 2 ranks loads the model and
# optimizer and trains 3 steps to PyTorch's own next 3 steps' parameters (1e-10). The reverse:
# cpprun saves, to-dcp converts (with to-cpprun's dcp_extra.pt: train_state, lr_scheduler, each
# rank's dataloader entry), FSDP2 dcp.load's it and trains to cpprun's parameters (1e-10). Also:
# the {"model": ...} layout both ways is bit for bit; get_state_dict's optimizer form (not
# flattened) converts as the flattened one; a directory that is not DCP's, an optimizer state keyed
# by index, files of two saves, and a damaged file (cpprun's CRC) are refused by name.
# Usage: dcp_interop.sh TOOL CPPRUN PYTHON. Skips (77) without a python that has torch and safetensors.
set -u
tool=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch torch.distributed.checkpoint
export PYTHON_EXEC=$python  # the interpreter cpprun runs dcp_interop.py with
py=$here/dcp_interop.py
convert() { "$python" "$here/../../scripts/dcp_convert.py" "$@"; }
"$python" "$py" init "$dir" || fail "Python could not write the batches"

echo "--- PyTorch (FSDP2, 2 ranks) trains, dcp.save's, trains on"
"$cpprun" --standalone --nproc_per_node=2 "$py" train "$dir" || fail "PyTorch could not train and save"
ls -a "$dir/dcp"
out=$(convert to-cpprun "$dir/dcp" "$dir/from_dcp" 2>&1) || fail "to-cpprun: $out"
echo "$out"
for entry in train_state.step lr_scheduler.last_epoch dataloader.dp_rank_0 dataloader.dp_rank_1; do
  grep -q "kept in dcp_extra.pt: $entry" <<<"$out" || fail "to-cpprun does not say where $entry went"
done
grep -q '"cpprun_step": "3"' "$dir/from_dcp/model.safetensors.index.json" || fail "train_state.step is not the cpprun_step"
"$cpprun" --standalone --nproc_per_node=2 "$tool" train "$dir" || fail "cpprun could not train and save"
"$cpprun" --standalone --nproc_per_node=2 "$tool" resume "$dir" || fail "cpprun's steps from PyTorch's checkpoint differ"

echo "--- cpprun (FSDP, 2 ranks) saved; to DCP; PyTorch (FSDP2, 2 ranks) resumes"
convert to-dcp "$dir/cpp_ckpt" "$dir/to_dcp" --extra "$dir/from_dcp/dcp_extra.pt" || fail "to-dcp failed"
"$cpprun" --standalone --nproc_per_node=2 "$py" resume "$dir" || fail "PyTorch's steps from cpprun's checkpoint differ"

echo "--- the {\"model\": ..., \"optimizer\": ...} layout, there and back"
convert to-dcp "$dir/cpp_ckpt" "$dir/nested_dcp" --model-key model >/dev/null || fail "to-dcp --model-key model failed"
convert to-cpprun "$dir/nested_dcp" "$dir/nested_back" >/dev/null || fail "to-cpprun of the nested layout failed"
"$python" "$py" same "$dir/cpp_ckpt" "$dir/nested_back" || fail "the round trip changed the checkpoint"

echo "--- the optimizer not flattened (get_state_dict's default) converts as flattened"
"$python" -W "ignore:torch.distributed is disabled" "$py" forms "$dir" || fail "Python could not save the three forms"
convert to-cpprun "$dir/form_flat_dcp" "$dir/flat_back" >/dev/null || fail "to-cpprun of the flattened form failed"
convert to-cpprun "$dir/form_nested_dcp" "$dir/nested_form_back" >/dev/null || fail "to-cpprun of the nested form failed"
"$python" "$py" same "$dir/flat_back" "$dir/nested_form_back" || fail "the two forms convert differently"

echo "--- refusals"
out=$(convert to-cpprun "$dir/form_by_index_dcp" "$dir/by_index_back" 2>&1) && fail "to-cpprun took a state keyed by index"
echo "$out"
grep -qF "keyed by parameter index" <<<"$out" || fail "the refusal does not say \"keyed by parameter index\""
out=$(convert to-cpprun "$dir/cpp_ckpt" "$dir/not_dcp" 2>&1) && fail "to-cpprun took a directory without .metadata"
echo "$out"
grep -qF "holds no .metadata" <<<"$out" || fail "the refusal does not say \"holds no .metadata\""
mkdir "$dir/mixed"
cp "$dir"/from_dcp/model* "$dir"/cpp_ckpt/optimizer* "$dir/mixed/"
out=$(convert to-dcp "$dir/mixed" "$dir/mixed_dcp" 2>&1) && fail "to-dcp took files of two saves"
echo "$out"
grep -qF "are from different saves" <<<"$out" || fail "the refusal does not say \"are from different saves\""
cp -r "$dir/cpp_ckpt" "$dir/damaged"
"$python" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 1]))' \
  "$dir/damaged/optimizer-00001-of-00002.safetensors"
out=$(convert to-dcp "$dir/damaged" "$dir/damaged_dcp" 2>&1) && fail "to-dcp took a damaged file"
echo "$out"
grep -qF "optimizer-00001-of-00002.safetensors is damaged" <<<"$out" || fail "the refusal does not name the damaged file"
echo "PASS: PyTorch's torch.distributed.checkpoint <-> cpprun, model and AdamW state"
