#!/usr/bin/env bash
# State dicts move both ways between cpprun and PyTorch/safetensors, each read by the other side's
# own reader: cpprun's .pt and .safetensors load with torch.load(path) and
# safetensors.torch.load_file(path) defaults; torch.save(model.state_dict()) and
# safetensors.torch.save_file files load into cpprun; a file of other shapes is refused, named.
# Usage: state_dict_interop.sh TOOL PYTHON. Skips (77) without a python that has torch and safetensors.
set -u
tool=$1
python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$tool" write "$dir" || fail "state_dict_interop write"
"$python" "$here/state_dict_interop.py" check "$dir" || fail "Python could not read cpprun's files"
"$python" "$here/state_dict_interop.py" write "$dir" || fail "Python could not write its files"
# Any name: the format is told from the bytes (checkpoint.pth.tar is torch.save's, model.ckpt safetensors).
for file in py.pt py.safetensors checkpoint.pth.tar model.ckpt; do
  "$tool" read "$dir/$file" || fail "cpprun could not load $file"
done
out=$("$tool" refuse "$dir/py_other.pt") || fail "$out"
echo "$out"
for expected in "refused (StateDictMismatchError): cpprun: load_state_dict refused $dir/py_other.pt" \
                "body.0.weight: file float32 \[6, 4\], module float32 \[3, 4\]"; do
  grep -q "$expected" <<<"$out" || fail "the refusal does not say \"$expected\""
done
refusal() {  # FILE EXPECTED...: cpprun refuses FILE, saying each EXPECTED (fixed strings)
  local file=$1 out expected
  shift
  out=$("$tool" refuse "$dir/$file") || fail "$out"
  for expected in "$@"; do
    grep -qF -- "$expected" <<<"$out" || fail "the refusal of $file does not say \"$expected\": $out"
  done
}
# dcp.save's directory: named, with the conversion's command line.
refusal py_dcp "refused (StateDictMismatchError)" "torch.distributed.checkpoint (DCP) directory" \
  "python scripts/dcp_convert.py to-cpprun $dir/py_dcp OUT_DIR"
# DDP's names: the hint names the option, which then loads the file.
refusal py_ddp.pt "refused (StateDictMismatchError)" \
  "Every name the file holds and the module lacks is one of the module's with \"module.\" before it" \
  "StateDictOptions().consume_prefix_in_state_dict_if_present(\"module.\")"
"$tool" read_ddp "$dir/py_ddp.pt" || fail "cpprun could not load py_ddp.pt with the option its refusal names"
# A checkpoint dict and a whole module: sound files of something else, not "corrupt".
refusal py_checkpoint.pth.tar "refused (StateDictMismatchError)" "is a torch.save file, but not of a state dict" \
  "\"epoch\" (an int)" "the state dict is under \"model\"" \
  "torch.save(torch.load(\"$dir/py_checkpoint.pth.tar\")[\"model\"], \"model.pt\")"
refusal py_whole.pt "refused (StateDictMismatchError)" "names the Python class or function __main__.Net"
# The newer dtypes (uint16-64, float8, complex) and views saved with a negation or conjugation
# pending, both ways; transformers' pytorch_model.bin; what cpprun does not read, named.
"$python" "$here/state_dict_interop.py" write_dtypes "$dir" || fail "Python could not write its dtype files"
for file in py_dtypes.pt py_dtypes.safetensors; do
  "$tool" dump "$dir/$file" >"$dir/$file.dump" || fail "cpprun could not read $file: $(cat "$dir/$file.dump")"
  diff <(sort "$dir/$file.expected") <(sort "$dir/$file.dump") ||
    fail "cpprun read $file otherwise than PyTorch (expected, then read)"
done
"$tool" write_dtypes "$dir" || fail "state_dict_interop write_dtypes"
"$python" "$here/state_dict_interop.py" check_dtypes "$dir" || fail "Python could not read cpprun's dtype files"
"$tool" read "$dir/bin" || fail "cpprun could not load bin/pytorch_model.bin"
for refused in "py_legacy.pt:in torch.save's legacy format" \
               "py_legacy_protocol0.ckpt:in torch.save's legacy format" \
               "py_legacy_protocol4.ckpt:in torch.save's legacy format" \
               "bin_sharded:holds pytorch_model.bin.index.json, transformers' sharded torch.save files"; do
  out=$("$tool" refuse "$dir/${refused%%:*}") || fail "$out"
  grep -qF "${refused#*:}" <<<"$out" || fail "the refusal of ${refused%%:*} does not say \"${refused#*:}\": $out"
done
echo "PASS: cpprun <-> PyTorch <-> safetensors"
