# Sourced by the tests that check cpprun's files with Python's own readers (state_dict_interop.sh,
# optimizer_state_interop.sh, hf_sharded_interop.sh, gpt2_interop.sh):
#   interop_setup PYTHON MODULE...
# exits 77 (SKIP, saying why) unless PYTHON has every MODULE installed, so the test is reported skipped
# rather than passed where the set-up script has not run; then sets $dir to a scratch directory
# removed at exit, and defines fail MESSAGE (prints FAIL: MESSAGE, exits 1).
interop_setup() {
  local python=$1
  shift
  local modules
  modules=$(IFS=,; echo "$*")
  # find_spec, not import: it answers in milliseconds where importing transformers takes seconds,
  # and the test imports them itself (a module that is there but broken fails the test, as it should).
  if [ -z "$python" ] || ! "$python" -c "import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))" "$@" 2>/dev/null; then
    echo "SKIP: needs a python that imports ${modules//,/, } (run scripts/setup.sh, or -DCPPRUN_TORCH_PYTHON=...)"
    exit 77
  fi
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  fail() { echo "FAIL: $*"; exit 1; }
}
