# Mistyped options get a "did you mean"; shortened ones are read as argparse reads them (an ambiguous
# one lists the candidates); contradicting Python modes and a missing script are refused at once; a
# script runs under the active environment's python, which cpprun names.
. "$(dirname "$0")/common.sh"

cpprun --nproc_pre_node=2 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "typo exit code"
expect_in_file "$WORK/err" "unknown option --nproc_pre_node; did you mean --nproc_per_node?" "suggestion"
cpprun --standalnoe /bin/true
expect_in_file "$WORK/err" "did you mean --standalone?" "suggestion"
cpprun --bogus /bin/true
grep -q "did you mean" "$WORK/err" && fail "a suggestion for --bogus"

cpprun --no_python -m pkg.train --lr 1
expect_eq "$?" 2 "--no_python -m exit code"
expect_in_file "$WORK/err" "--no_python and -m/--module contradict each other" "--no_python -m message"
cpprun --nproc_per_node=2 missing.py
expect_eq "$?" 127 "missing script's exit code"
expect_in_file "$WORK/err" "cannot run the Python script 'missing.py': no such file" "missing script's message"

# A script runs under the active environment's python before PATH's, and cpprun says which it chose.
unset VIRTUAL_ENV CONDA_PREFIX PYTHON_EXEC  # the caller's own, if any, would choose
mkdir -p "$WORK/venv/bin" "$WORK/conda/bin" "$WORK/path"
for py in "$WORK/venv/bin/python" "$WORK/conda/bin/python" "$WORK/path/python3"; do
  printf '#!/bin/sh\necho "%s ran $*"\n' "$py" >"$py"
  chmod +x "$py"
done
touch "$WORK/train.py"
(cd "$WORK" && VIRTUAL_ENV=$WORK/venv CONDA_PREFIX=$WORK/conda PATH=$WORK/path:$PATH cpprun --nproc_per_node=2 train.py --lr 1)
expect_eq "$?" 0 "VIRTUAL_ENV's python's exit code"
expect_in_file "$WORK/err" "cpprun: running train.py with $WORK/venv/bin/python (VIRTUAL_ENV)" "VIRTUAL_ENV's python said"
expect_in_file "$WORK/out" "[rank1]: $WORK/venv/bin/python ran -u train.py --lr 1" "VIRTUAL_ENV's python ran"
(cd "$WORK" && CONDA_PREFIX=$WORK/conda PATH=$WORK/path:$PATH cpprun -m pkg.train)
expect_in_file "$WORK/err" "cpprun: running -m pkg.train with $WORK/conda/bin/python (CONDA_PREFIX)" "CONDA_PREFIX's python said"
expect_in_file "$WORK/out" "$WORK/conda/bin/python ran -u -m pkg.train" "CONDA_PREFIX's python ran"
(cd "$WORK" && VIRTUAL_ENV=$WORK/gone PATH=$WORK/path:$PATH cpprun train.py)
expect_in_file "$WORK/err" "cpprun: running train.py with $WORK/path/python3 (python3 on PATH; VIRTUAL_ENV=$WORK/gone has no runnable bin/python)" \
  "a VIRTUAL_ENV without python passed over, and said"
(cd "$WORK" && PYTHON_EXEC=$WORK/path/python3 VIRTUAL_ENV=$WORK/venv cpprun train.py)
expect_in_file "$WORK/err" "cpprun: running train.py with $WORK/path/python3 (PYTHON_EXEC)" "PYTHON_EXEC first, as torchrun"

# Prefixes: --nproc, --max_rest and --dry are cpprun's options; PROGRAM's arguments stay as they are.
cpprun --nproc 2 --max_rest 1 --dry /bin/echo --nproc 5
expect_eq "$?" 0 "abbreviated options' exit code"
expect_in_file "$WORK/out" "dry run: 2 workers would start" "--nproc 2"
expect_in_file "$WORK/out" "TORCHELASTIC_MAX_RESTARTS=1" "--max_rest 1"
expect_in_file "$WORK/out" "command: /bin/echo --nproc 5" "PROGRAM's arguments"
cpprun --rdzv 1 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "ambiguous prefix exit code"
expect_in_file "$WORK/err" "ambiguous option --rdzv: it could be --rdzv_backend, --rdzv_endpoint, --rdzv_conf, --rdzv_id; write more of it" \
  "ambiguous prefix message"

cpprun --nnodes=1:2 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--nnodes=1:2 exit code"
expect_in_file "$WORK/err" "a range of nodes needs the dynamic rendezvous: add --rdzv_backend=c10d" "--nnodes=1:2 message"
cpprun --nnodes=2 --rdzv_backend=etcd /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--rdzv_backend=etcd exit code"
expect_in_file "$WORK/err" "the etcd rendezvous is not implemented" "--rdzv_backend message"
cpprun --nnodes=2 --rdzv_conf close_timout=3 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--rdzv_conf exit code"
expect_in_file "$WORK/err" "'close_timout=3' is not a setting" "--rdzv_conf message"
[ ! -e "$WORK/started" ] || fail "a worker ran"
expect_no_leftovers
echo PASS
