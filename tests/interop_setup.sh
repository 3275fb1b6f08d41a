# Sourced by the tests that check cpprun's files with Python's own readers (state_dict_interop.sh,
# optimizer_state_interop.sh, hf_sharded_interop.sh, gpt2_interop.sh):
#   interop_setup PYTHON MODULE...
# exits 77 (SKIP, saying why) unless PYTHON imports every MODULE, so the test is reported skipped
# rather than passed where the set-up script has not run; then sets $dir to a scratch directory
# removed at exit, and defines fail MESSAGE (prints FAIL: MESSAGE, exits 1).
interop_setup() {
  local python=$1
  shift
  local modules
  modules=$(IFS=,; echo "$*")
  if [ -z "$python" ] || ! "$python" -c "import $modules" 2>/dev/null; then
    echo "SKIP: needs a python that imports ${modules//,/, } (run scripts/setup.sh, or -DCPPRUN_TORCH_PYTHON=...)"
    exit 77
  fi
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  fail() { echo "FAIL: $*"; exit 1; }
}
