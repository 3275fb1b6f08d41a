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

cpprun --nnodes=1:2 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--nnodes=1:2 exit code"
expect_in_file "$WORK/err" "elastic jobs (MIN:MAX with MIN != MAX" "--nnodes=1:2 message"
expect_in_file "$WORK/err" "not implemented yet" "--nnodes=1:2 message"
cpprun --nnodes=2 --rdzv_backend=c10d /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--rdzv_backend=c10d exit code"
expect_in_file "$WORK/err" "dynamic (elastic) rendezvous is not implemented yet" "--rdzv_backend message"
cpprun --nnodes=2 --rdzv_conf close_timeout=3 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--rdzv_conf exit code"
expect_in_file "$WORK/err" "join_timeout=SECONDS" "--rdzv_conf message"
[ ! -e "$WORK/started" ] || fail "a worker ran"
expect_no_leftovers
echo PASS
