# Where torchrun 2.15's behaviour is easy to miss: each part names the torchrun source it matches.
. "$(dirname "$0")/common.sh"

# (1) --nproc_per_node=cpu|auto count the CPUs cpprun may run on (torch._utils.cpu_count(), that is
# len(os.sched_getaffinity(0))), not the machine's: taskset, a cgroup cpuset, Slurm's --cpus-per-task.
if command -v taskset >/dev/null && [ "$(nproc --all)" -gt 1 ]; then
  for value in cpu auto; do
    CUDA_VISIBLE_DEVICES= taskset -c 0 "$CPPRUN" --dry_run --nproc_per_node=$value /bin/true >"$WORK/out" 2>"$WORK/err"
    expect_eq "$?" 0 "--nproc_per_node=$value under taskset -c 0"
    expect_in_file "$WORK/out" "1 worker would start" "--nproc_per_node=$value under taskset -c 0: one worker"
  done
fi

# Waits up to 10 s for the files named.
wait_for_files() {
  local i f missing
  for i in $(seq 200); do
    missing=0
    for f in "$@"; do [ -e "$f" ] || missing=1; done
    [ $missing = 0 ] && return 0
    sleep 0.05
  done
  fail "timed out waiting for $*"
}

# (4) The launcher stopped by a signal writes its TORCHELASTIC_ERROR_FILE as torchrun's @record main
# records the agent's SignalException (launcher/api.py, elastic/multiprocessing/api.py), after the
# workers were stopped: {"message": {"message": "SignalException: Process PID got signal: N", ...}}.
for sig in TERM HUP; do
  rm -f "$WORK"/ready.* "$WORK/launcher.json"
  TORCHELASTIC_ERROR_FILE=$WORK/launcher.json CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 --master_port=29662 \
    /bin/sh -c 'touch "$WORK/ready.$RANK"; exec sleep 30' >"$WORK/out" 2>"$WORK/err" &
  launcher=$!
  wait_for_files "$WORK/ready.0" "$WORK/ready.1"
  kill -$sig $launcher
  wait $launcher
  code=$?
  number=$(kill -l $sig)
  expect_eq "$code" $((128 + number)) "exit code after SIG$sig"
  expect_in_file "$WORK/launcher.json" "{\"message\": {\"message\": \"SignalException: Process $launcher got signal: $number\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"" "SIG$sig in the launcher's error file"
done
# A job that ends well writes nothing there.
rm -f "$WORK/launcher.json"
TORCHELASTIC_ERROR_FILE=$WORK/launcher.json cpprun --master_port=29662 /bin/true
expect_eq "$?" 0 "a job that succeeds"
[ ! -e "$WORK/launcher.json" ] || fail "a job that succeeded wrote the launcher's error file"

# (6) The guardian shares cpprun's command line, and `pgrep -nf` (the newest match) names it: a
# SIGTERM sent to it reaches cpprun, which stops the job as torchrun (one process) would.
rm -f "$WORK"/ready.*
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 --master_port=29663 \
  /bin/sh -c 'touch "$WORK/ready.$RANK"; exec sleep 30' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files "$WORK/ready.0" "$WORK/ready.1"
newest=$(pgrep -nf "^$CPPRUN --nproc_per_node=2 --master_port=29663")
[ -n "$newest" ] && [ "$newest" != "$launcher" ] || fail "pgrep -nf did not name the guardian (got '$newest', cpprun is $launcher)"
started=$(date +%s)
kill -TERM "$newest"
wait $launcher
expect_eq "$?" 143 "exit code after SIGTERM to the guardian"
[ $(( $(date +%s) - started )) -lt 15 ] || fail "the job ran on after SIGTERM to the guardian"
expect_in_file "$WORK/err" "received SIGTERM" "cpprun's account of the relayed SIGTERM"

# A signal that reaches both cpprun and the guardian (pkill -f, scancel, systemd's control-group kill)
# reaches each worker once, as torchrun's one process passes it on once (Note [One signal, two
# routes]): a second SIGINT would cut a Python worker's `finally` short.
rm -f "$WORK"/ready.* "$WORK"/ints.*
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 --master_port=29665 \
  /bin/sh -c 'trap "echo INT >>\"$WORK/ints.$RANK\"" INT; touch "$WORK/ready.$RANK"; sleep 3 & wait; sleep 3 & wait' \
  >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files "$WORK/ready.0" "$WORK/ready.1"
guardian=$(pgrep -nf "^$CPPRUN --nproc_per_node=2 --master_port=29665")
[ -n "$guardian" ] && [ "$guardian" != "$launcher" ] || fail "no guardian found for the double-signal case"
kill -INT "$launcher"
sleep 0.1
kill -INT "$guardian"
wait $launcher
for r in 0 1; do
  expect_eq "$(wc -l <"$WORK/ints.$r" 2>/dev/null || echo 0)" 1 "SIGINTs rank $r got from one SIGINT sent to cpprun and to its guardian"
done

# (2) --run_path as torchrun's, whose worker runs the script under torch's record()
# (elastic/multiprocessing/api.py): an exception lands in the rank's error.json and, handed over, in
# the launcher's TORCHELASTIC_ERROR_FILE with errorCode; none of cpprun's own files (the exit
# barrier's) is left in the --log_dir tree. run.py looks at --run_path before -m and --no_python.
if python=$(command -v python3); then
  cat >"$WORK/rp.py" <<'PY'
import os, sys, time
rank = int(os.environ["RANK"])
print("rank", rank, "ran", sys.argv[1:], flush=True)
if sys.argv[1:] == ["exc"] and rank == 1:
    time.sleep(0.5)  # rank 0 is in the exit barrier by now
    raise ValueError("rp boom")
PY
  rm -f "$WORK/launcher.json"
  PYTHON_EXEC=$python TORCHELASTIC_ERROR_FILE=$WORK/launcher.json cpprun --nproc_per_node=2 --master_port=29664 \
    --log_dir "$WORK/rplogs" --run_path "$WORK/rp.py" exc
  expect_eq "$?" 1 "--run_path with rank 1 raising: exit code"
  run=$(run_dir_in "$WORK/rplogs")
  expect_in_file "$run/attempt_0/1/error.json" '{"message": {"message": "ValueError: rp boom", "extraInfo": {"py_callstack": "Traceback' "rank 1's error.json"
  expect_in_file "$WORK/launcher.json" '"message": "ValueError: rp boom"' "the launcher's error file"
  expect_in_file "$WORK/launcher.json" '"errorCode": 1' "the launcher's error file's errorCode"
  expect_in_file "$WORK/err" "ValueError: rp boom" "the failure summary"
  left=$(find "$WORK/rplogs" -type f ! -name error.json)
  [ -z "$left" ] || fail "cpprun's own files left in the --log_dir tree: $left"
  for flags in "-m --run_path" "--no_python --run_path" "--run_path -m --no_python"; do
    PYTHON_EXEC=$python cpprun --nproc_per_node=2 --master_port=29664 --log_dir "$WORK/rplogs2" $flags "$WORK/rp.py" ok
    expect_eq "$?" 0 "$flags: exit code"
    expect_in_file "$WORK/out" "[rank1]: rank 1 ran ['ok']" "$flags: the script ran"
  done
  left=$(find "$WORK/rplogs2" -type f)
  [ -z "$left" ] || fail "cpprun's own files left in the --log_dir tree after a success: $left"
fi

# (5) --log_dir=/dev/null, torchrun's DefaultLogsSpecs' special value: the job runs, no file is
# written, the workers' TORCHELASTIC_ERROR_FILE is empty, --redirects/--tee leave the output on the console.
cpprun --nproc_per_node=2 --master_port=29665 --log_dir=/dev/null --redirects=3 \
  /bin/sh -c 'echo "EF=[$TORCHELASTIC_ERROR_FILE] rank $RANK"; echo "err $RANK" >&2'
expect_eq "$?" 0 "--log_dir=/dev/null: exit code"
for rank in 0 1; do
  expect_in_file "$WORK/out" "[rank$rank]: EF=[] rank $rank" "--log_dir=/dev/null: rank $rank's output and empty TORCHELASTIC_ERROR_FILE"
  expect_in_file "$WORK/err" "[rank$rank]: err $rank" "--log_dir=/dev/null: rank $rank's stderr on the console"
done
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
cpprun --nproc_per_node=2 --master_port=29665 --log_dir=/dev/null /bin/sh -c 'exit $((RANK * 3))'
expect_eq "$?" 3 "--log_dir=/dev/null: a failing worker's exit code"

# (7) TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, PyTorch's opt-out of the agent's store, read by torchrun's
# c10d handler (dynamic_rendezvous.py), which runs a one-node job without --master_port: the workers
# get TORCHELASTIC_USE_AGENT_STORE=False and worker rank 0 hosts the store at MASTER_PORT. The static
# backend (--master_port given) ignores it, as torchrun's.
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 cpprun --nproc_per_node=2 /bin/sh -c 'env > "$WORK/optout.$RANK"'
expect_eq "$?" 0 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: exit code"
grep -qxF TORCHELASTIC_USE_AGENT_STORE=False "$WORK/optout.1" || fail "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: TORCHELASTIC_USE_AGENT_STORE"
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 cpprun --nproc_per_node=2 --master_port=29666 /bin/sh -c 'env > "$WORK/static.$RANK"'
grep -qxF TORCHELASTIC_USE_AGENT_STORE=True "$WORK/static.1" || fail "static with --master_port: TORCHELASTIC_USE_AGENT_STORE"
if [ -n "${CPPRUN_TORCH_PYTHON:-}" ]; then
  cat >"$WORK/optout.py" <<'PY'
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)], dtype=torch.float64)
dist.all_reduce(t)
print("sum", t.item(), "agent store", os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
dist.destroy_process_group()
os._exit(0)
PY
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHON_EXEC=$CPPRUN_TORCH_PYTHON cpprun --nproc_per_node=2 "$WORK/optout.py"
  expect_eq "$?" 0 "torch.distributed with worker rank 0 hosting the store: exit code"
  expect_in_file "$WORK/out" "[rank1]: sum 3.0 agent store False" "torch.distributed with rank 0 hosting the store"
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHON_EXEC=$CPPRUN_TORCH_PYTHON cpprun --nproc_per_node=2 --nnodes=1 \
    --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29667 "$WORK/optout.py"
  expect_eq "$?" 0 "torch.distributed with rank 0 hosting the store, c10d at an endpoint: exit code"
  expect_in_file "$WORK/out" "[rank1]: sum 3.0 agent store False" "torch.distributed with rank 0 hosting the store, c10d at an endpoint"
fi
# A c10d job at an --rdzv_endpoint of one node (--nnodes=1 or 1:1) too: torchrun's c10d handler gives its
# workers the rank-0 node's --local_addr (else its FQDN; cpprun: the endpoint's host) and a port free
# there (RendezvousStoreInfo.build), and runs no store of the agent's for them.
for nnodes in 1 1:1; do
  rm -f "$WORK"/c10d_optout.*
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 cpprun --nproc_per_node=2 --nnodes=$nnodes --rdzv_backend=c10d \
    --rdzv_endpoint=127.0.0.1:29667 /bin/sh -c 'env > "$WORK/c10d_optout.$RANK"'
  expect_eq "$?" 0 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, c10d at an endpoint, --nnodes=$nnodes: exit code"
  for rank in 0 1; do
    grep -qxF TORCHELASTIC_USE_AGENT_STORE=False "$WORK/c10d_optout.$rank" ||
      fail "c10d at an endpoint, --nnodes=$nnodes: rank $rank's TORCHELASTIC_USE_AGENT_STORE"
    grep -qxF MASTER_ADDR=127.0.0.1 "$WORK/c10d_optout.$rank" || fail "c10d at an endpoint, --nnodes=$nnodes: MASTER_ADDR"
  done
  port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/c10d_optout.0")
  [ -n "$port" ] && [ "$port" != 29667 ] || fail "c10d at an endpoint: MASTER_PORT '$port' is not a free port of its own"
  grep -qxF "MASTER_PORT=$port" "$WORK/c10d_optout.1" || fail "c10d at an endpoint: the ranks' MASTER_PORT differ"
  grep -q "store keeper\|not implemented" "$WORK/err" && fail "c10d at an endpoint, --nnodes=$nnodes: a keeper or a note"
done
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 cpprun --nproc_per_node=2 --nnodes=1 --rdzv_backend=c10d \
  --rdzv_endpoint=127.0.0.1:29667 --local_addr=localhost /bin/sh -c 'env > "$WORK/c10d_local.$RANK"'
grep -qxF MASTER_ADDR=localhost "$WORK/c10d_local.1" || fail "c10d at an endpoint with --local_addr: MASTER_ADDR"
# Several nodes keep the agents' store (their workers reach it through cpprun's authenticated link): a note says so.
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 cpprun --dry_run --nproc_per_node=2 --nnodes=1:2 --rdzv_backend=c10d \
  --rdzv_endpoint=127.0.0.1:29667 /bin/true
expect_in_file "$WORK/err" "honoured for a c10d job of one node only" "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 with --nnodes=1:2: the note"
expect_in_file "$WORK/out" "TORCHELASTIC_USE_AGENT_STORE=True" "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 with --nnodes=1:2: the agents' store"

expect_no_leftovers
echo PASS
