# Mistyped options get a "did you mean"; torchrun's Python-only modes say what to run instead.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_nod=2 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "typo exit code"
expect_in_file "$WORK/err" "unknown option --nproc_per_nod; did you mean --nproc_per_node?" "suggestion"
cpprun --standalon /bin/true
expect_in_file "$WORK/err" "did you mean --standalone?" "suggestion"
cpprun --bogus /bin/true
grep -q "did you mean" "$WORK/err" && fail "a suggestion for --bogus"

cpprun -m pkg.train --lr 1
expect_eq "$?" 2 "-m exit code"
expect_in_file "$WORK/err" '`cpprun [options] python3 -m pkg.train [args...]`' "-m hint"
cpprun --module pkg.train
expect_in_file "$WORK/err" "cpprun runs programs directly, not Python modules" "--module hint"
cpprun --run_path train.py
expect_eq "$?" 2 "--run_path exit code"
expect_in_file "$WORK/err" '`cpprun [options] python3 train.py [args...]`' "--run_path hint"

cpprun --nnodes=2 /bin/true
expect_eq "$?" 2 "--nnodes=2 exit code"
expect_in_file "$WORK/err" "this launcher runs a single node" "--nnodes message"
[ ! -e "$WORK/started" ] || fail "a worker ran"
expect_no_leftovers
echo PASS
