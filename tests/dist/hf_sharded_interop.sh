#!/usr/bin/env bash
# Hugging Face sharded directories move both ways between cpprun and Python, each read by the other
# side's own reader: FSDP stage 3 on 4 ranks saves a directory that safetensors.torch.load_file
# (per file, with the index) reads as one model, equal to the reference, and transformers'
# sharded-checkpoint reader too where transformers is installed; a directory Python writes
# (safetensors.torch.save_file + index json) loads into cpprun; one whose index places a tensor
# in a file without it is refused, naming the file.
# Usage: hf_sharded_interop.sh TOOL CPPRUN PYTHON. Skips (77) without a python that has torch and safetensors.
set -u
tool=$1
cpprun=$2
python=${3:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$cpprun" --standalone --nproc_per_node=4 "$tool" write_sharded "$dir/cpp_sharded" || fail "cpprun could not save on 4 ranks"
ls "$dir/cpp_sharded"
"$python" "$here/../unit/state_dict_interop.py" check_sharded "$dir/cpp_sharded" 4
case $? in
  0) ;;
  77) exit 77 ;;  # transformers missing: its reader untried (the line above says so)
  *) fail "Python could not read cpprun's sharded directory" ;;
esac
"$python" "$here/../unit/state_dict_interop.py" write_sharded "$dir" || fail "Python could not write its directories"
"$tool" read "$dir/py_sharded/" || fail "cpprun could not load Python's sharded directory"
"$tool" read "$dir/py_sharded/model.safetensors.index.json" || fail "cpprun could not load it by its index"
out=$("$tool" refuse "$dir/py_sharded_lacking") || fail "$out"
echo "$out"
expected='model-00003-of-00003.safetensors lacks "body.0.weight", which the index places there'
grep -qF "$expected" <<<"$out" || fail "the refusal does not say \"$expected\""
echo "PASS: cpprun <-> safetensors, Hugging Face sharded directories"
