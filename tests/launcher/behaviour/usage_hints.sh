# Mistyped options get a "did you mean"; shortened ones are read as argparse reads them (an ambiguous
# one lists the candidates); torchrun's Python-only modes say what to run instead.
. "$(dirname "$0")/common.sh"

cpprun --nproc_pre_node=2 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "typo exit code"
expect_in_file "$WORK/err" "unknown option --nproc_pre_node; did you mean --nproc_per_node?" "suggestion"
cpprun --standalnoe /bin/true
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
cpprun --nnodes=2 --rdzv_conf close_timeout=3 /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--rdzv_conf exit code"
expect_in_file "$WORK/err" "join_timeout=SECONDS" "--rdzv_conf message"
[ ! -e "$WORK/started" ] || fail "a worker ran"
expect_no_leftovers
echo PASS
