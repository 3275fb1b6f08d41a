# cpprun beside the real torchrun (PyTorch's, from CPPRUN_TORCH_PYTHON): every option `torchrun --help`
# lists is accepted by cpprun and documented in docs/torchrun_options.md; and for the same command
# lines both give the workers the same variables, lay out --log_dir alike, accept --rdzv_conf as
# PyTorch's own tests quote it, refuse a --logs_specs entry point nothing installs, make a temp log
# dir for --redirects without --log_dir, and hand the failing worker's error file to the launcher's
# TORCHELASTIC_ERROR_FILE alike.
. "$(dirname "$0")/common.sh"
require_private_netns  # torchrun's c10d store listens on every interface
find_torch_python_or_skip
docs=$(dirname "$0")/../../../docs/torchrun_options.md
[ -f "$docs" ] || fail "no $docs"
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
mkdir -p "$WORK/torchrun-tmp"

torchrun() {  # like cpprun(): output to $WORK/out and $WORK/err; its own TMPDIR (it leaves torchelastic_* dirs)
  CPPRUN_TEST_TAG=$WORK TMPDIR=$WORK/torchrun-tmp "$python" -m torch.distributed.run "$@" >"$WORK/out" 2>"$WORK/err"
}

# 1. Every option of torchrun's --help, in each spelling, with a value torchrun accepts.
"$python" -m torch.distributed.run --help >"$WORK/help" 2>&1 || fail "torchrun --help failed"
spellings=$(sed -n '/^options:/,$p' "$WORK/help" | grep -E '^  -' | sed -E 's/^  //; s/  .*//' | tr ',' '\n' |
            sed -E 's/^ //; s/ .*//' | grep -E '^-' | sort -u)
[ "$(printf '%s\n' "$spellings" | wc -l)" -gt 40 ] || fail "could not read torchrun's options from its --help"
value_for() {  # a value torchrun accepts for option $1 ("" for a flag); exit 1 for an option not known here
  case ${1//_/-} in
    -h|--help|--standalone|-m|--module|--no-python|--run-path|--virtual-local-rank) echo "" ;;
    --nnodes|--nproc-per-node|--max-restarts|--shutdown-timeout) echo 1 ;;
    --node-rank) echo 0 ;;
    --rdzv-backend) echo static ;;
    --rdzv-endpoint) echo 127.0.0.1:29530 ;;
    --rdzv-id) echo job ;;
    --rdzv-conf) echo "'join_timeout=5,last_call_timeout=1,timeout=5'" ;;
    --master-addr) echo 127.0.0.1 ;;
    --master-port) echo 29530 ;;
    --monitor-interval) echo 0.5 ;;
    --start-method) echo spawn ;;
    --event-log-handler) echo null ;;
    --role) echo trainer ;;
    --log-dir) echo "$WORK/option-logs" ;;
    -r|--redirects|-t|--tee) echo 0 ;;
    --log-line-prefix-template) echo '${rank}: ' ;;
    --local-ranks-filter) echo 0 ;;
    --duplicate-stdout-filters|--duplicate-stderr-filters) echo "apple,orange" ;;
    --local-addr) echo 127.0.0.1 ;;
    --logs-specs) echo default ;;
    --numa-binding) echo node ;;
    --signals-to-handle) echo SIGTERM,SIGUSR1 ;;
    --print-completion) echo bash ;;
    *) return 1 ;;
  esac
}
for option in $spellings; do
  value=$(value_for "$option") || fail "torchrun has an option this test does not know: $option (add it here and to docs/torchrun_options.md)"
  long=${option}
  case $option in -h) long=--help ;; -m) long=--module ;; -r) long=--redirects ;; -t) long=--tee ;; esac
  under=--$(printf '%s' "${long#--}" | tr - _)
  grep -qE -- "\`($under|$long)[\` ]" "$docs" ||
    fail "docs/torchrun_options.md does not list $long"
  args=("$option")
  [ -n "$value" ] && args+=("$value")
  case $option in -m|--module) args+=(--dry_run pkg.train) ;; *) args+=(--dry_run /bin/true) ;; esac
  cpprun "${args[@]}"
  rc=$?
  [ "$rc" -eq 0 ] || fail "cpprun refused torchrun's $option ${value:+$value }(exit $rc): $(cat "$WORK/err")"
done
# --logs_specs NAME nothing installs: torchrun raises ValueError, cpprun refuses it too (a usage error, 2),
# quoting torchrun's message.
torchrun --logs-specs=mine --no-python /bin/true && fail "torchrun accepted --logs-specs=mine"
expect_in_file "$WORK/err" "Could not find entrypoint under 'torchrun.logs_specs[mine]' key" "torchrun's refusal"
cpprun --logs-specs=mine --no-python /bin/true
expect_eq "$?" 2 "cpprun --logs-specs=mine exit code"
expect_in_file "$WORK/err" "Could not find entrypoint under 'torchrun.logs_specs[mine]' key" "cpprun's refusal quotes torchrun's"

# 2. One node without --master_port: the same variables, a free port and a uuid4 run id under both.
worker='env | grep -E "^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|ROLE_NAME|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]*|TORCH_NCCL_ASYNC_ERROR_HANDLING|OMP_NUM_THREADS)=" | sort > "$WORK/$LAUNCHER.env.$RANK"'
for launcher in cpprun torchrun; do
  LAUNCHER=$launcher $launcher --nproc_per_node=2 --no_python /bin/sh -c "$worker" ||
    fail "$launcher: default two-worker job failed"
done
names() { sed 's/=.*//' "$1" | tr '\n' ' '; }
expect_eq "$(names "$WORK/cpprun.env.1")" "$(names "$WORK/torchrun.env.1")" "variable names, cpprun vs torchrun"
uuid4='^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
for launcher in cpprun torchrun; do
  sed -n 's/^TORCHELASTIC_RUN_ID=//p' "$WORK/$launcher.env.0" | grep -qE "$uuid4" || fail "$launcher: run id not a uuid4"
  [ "$(sed -n 's/^MASTER_PORT=//p' "$WORK/$launcher.env.0")" != 29500 ] || fail "$launcher: MASTER_PORT=29500"
done
# Equal values but for the run id, the port, the error file and one deliberate difference
# (docs/torchrun_options.md): MASTER_ADDR 127.0.0.1 (torchrun: localhost). TORCHELASTIC_USE_AGENT_STORE
# is True under both: each launcher's agent hosts the workers' store.
same='^(MASTER_PORT|TORCHELASTIC_RUN_ID|TORCHELASTIC_ERROR_FILE|MASTER_ADDR)='
expect_eq "$(grep -vE "$same" "$WORK/cpprun.env.1" | tr '\n' ' ')" "$(grep -vE "$same" "$WORK/torchrun.env.1" | tr '\n' ' ')" \
  "variable values, cpprun vs torchrun"

# 3. --log_dir with --redirects: the same tree (the run dir's random part aside), --rdzv-conf quoted as
# PyTorch's run_test.py passes it, --start-method and --monitor-interval as its tests pass them.
for launcher in cpprun torchrun; do
  $launcher --nproc-per-node=2 --redirects=3 --log-dir="$WORK/$launcher-logs" --start-method=spawn \
    --monitor-interval=1 --rdzv-conf="'join_timeout=5,last_call_timeout=1,timeout=5'" --no-python \
    /bin/sh -c 'echo "out $RANK"; echo "err $RANK" >&2' || fail "$launcher: --log_dir job failed"
  find "$WORK/$launcher-logs" -mindepth 1 -printf '%P\n' | sed -E 's/^[0-9a-f-]{36}_[a-z0-9_]{8}/RUN/' | sort \
    > "$WORK/$launcher.tree"
done
expect_eq "$(tr '\n' ' ' <"$WORK/cpprun.tree")" "$(tr '\n' ' ' <"$WORK/torchrun.tree")" "--log_dir tree, cpprun vs torchrun"
expect_eq "$(cat "$WORK"/cpprun-logs/*/attempt_0/1/stdout.log)" "$(cat "$WORK"/torchrun-logs/*/attempt_0/1/stdout.log)" \
  "stdout.log, cpprun vs torchrun"

# 4. --redirects without --log_dir: a torchelastic_* dir in $TMPDIR holding the same tree, kept.
export TMPDIR=$WORK/cpprun-tmp
mkdir -p "$TMPDIR"
cpprun --redirects=1 --no-python /bin/echo hello || fail "cpprun: --redirects without --log_dir failed"
export TMPDIR=$WORK/tmp
rm -rf "$WORK/torchrun-tmp"/*  # torchrun makes a torchelastic_* dir for every run
torchrun --redirects=1 --no-python /bin/echo hello || fail "torchrun: --redirects without --log_dir failed"
for launcher in cpprun torchrun; do
  dir=$(find "$WORK/$launcher-tmp" -mindepth 1 -maxdepth 1 -name 'torchelastic_*')
  [ -n "$dir" ] || fail "$launcher: no torchelastic_* dir for --redirects without --log_dir"
  expect_eq "$(cat "$dir"/*/attempt_0/0/stdout.log)" hello "$launcher: stdout.log in its temp log dir"
done

# 5. The failing worker's error file, in the launcher's TORCHELASTIC_ERROR_FILE, with errorCode.
failing='[ "$RANK" = 1 ] || exit 0
  printf "{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": {\"py_callstack\": \"tb\", \"timestamp\": \"17\"}}}" \
    > "$TORCHELASTIC_ERROR_FILE"
  exit 3'
for launcher in cpprun torchrun; do
  TORCHELASTIC_ERROR_FILE=$WORK/$launcher.error.json $launcher --nproc-per-node=2 --no-python /bin/sh -c "$failing"
  rc=$?
  [ "$rc" -ne 0 ] || fail "$launcher: the failing job exited 0"
  [ -f "$WORK/$launcher.error.json" ] || fail "$launcher: no launcher error file"
done
"$python" -c 'import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); sys.exit(a != b)' \
  "$WORK/cpprun.error.json" "$WORK/torchrun.error.json" ||
  fail "error files differ: cpprun $(cat "$WORK/cpprun.error.json"), torchrun $(cat "$WORK/torchrun.error.json")"
expect_in_file "$WORK/cpprun.error.json" '"errorCode": 3' "errorCode"

# 6. --log-line-prefix-template on --tee'd lines: the same prefix; --duplicate-stdout-filters: the same
# filtered_stdout.log (",," a comma in a needle).
for launcher in cpprun torchrun; do
  $launcher --tee=3 --log-dir="$WORK/$launcher-prefix" --log-line-prefix-template='${role_name}:${rank}| ' \
    --duplicate-stdout-filters='apple,,pie,orange' --no-python \
    /bin/sh -c 'echo hello; echo "apple,pie 1"; echo "apple 2"; echo "an orange"' ||
    fail "$launcher: --log-line-prefix-template failed"
  expect_in_file "$WORK/out" "default:0| hello" "$launcher's prefixed line"
  cat "$WORK/$launcher-prefix"/*/attempt_0/filtered_stdout.log > "$WORK/$launcher.filtered" ||
    fail "$launcher: no filtered_stdout.log"
done
expect_eq "$(cat "$WORK/cpprun.filtered")" "$(cat "$WORK/torchrun.filtered")" "filtered_stdout.log, cpprun vs torchrun"
expect_eq "$(cat "$WORK/cpprun.filtered")" "default:0| apple,pie 1
default:0| an orange" "filtered_stdout.log"
# torchrun's documented one-node c10d on a free port (--rdzv-endpoint=localhost:0): both launch, and
# each worker gets the port that was picked, not 0.
for launcher in cpprun torchrun; do
  $launcher --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2 --no-python \
    /bin/sh -c 'echo "port=$MASTER_PORT"' || fail "$launcher: --rdzv-endpoint=localhost:0 failed: $(tail -3 "$WORK/err")"
  expect_eq "$(grep -c 'port=[0-9]' "$WORK/out")" 2 "$launcher: workers that printed their MASTER_PORT"
  ports=$(grep -o 'port=[0-9]*' "$WORK/out" | sort -u)
  [ "$(printf '%s\n' "$ports" | wc -l)" = 1 ] && [ -n "$ports" ] && [ "$ports" != port=0 ] ||
    fail "$launcher: --rdzv-endpoint=localhost:0 gave the workers MASTER_PORT $ports"
done
# A flag's PET_<NAME> is bool(int(value)) under both (Note [A flag from PET_<NAME>]): -1 is on, so
# PROGRAM.py runs as it is, not under python (it is a shell script).
printf '#!/bin/sh\necho "pet-flag-on $0"\n' >"$WORK/flag.py"
chmod +x "$WORK/flag.py"
for launcher in cpprun torchrun; do
  PET_NO_PYTHON=-1 $launcher --nproc-per-node=1 "$WORK/flag.py" ||
    fail "$launcher: PET_NO_PYTHON=-1 did not run flag.py directly: $(tail -3 "$WORK/err")"
  expect_in_file "$WORK/out" "pet-flag-on" "$launcher's worker under PET_NO_PYTHON=-1"
  PET_NO_PYTHON=0 $launcher --nproc-per-node=1 "$WORK/flag.py" &&
    fail "$launcher: PET_NO_PYTHON=0 ran flag.py directly, not under python"
done
rm -rf "$WORK/torchrun-tmp" "$WORK/cpprun-tmp"
expect_no_leftovers
echo PASS
