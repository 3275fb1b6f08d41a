#!/usr/bin/env bash
# cpprun's safetensors header parser reads what Python's safetensors reads (files save_file wrote
# with odd names, their headers rewritten with escapes, another key order, white space) and refuses
# what it refuses (see safetensors_header_interop.py).
# Usage: safetensors_header_interop.sh DUMP_TOOL PYTHON. Skips (77) without torch and safetensors.
set -u
tool=$1
python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors.torch
"$python" "$here/safetensors_header_interop.py" "$tool" "$dir" || fail "cpprun and Python's safetensors differ"
echo "PASS"
