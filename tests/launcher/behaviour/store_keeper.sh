# The workers' store keeper of a single-node job (Note [Store keeper] in
# launcher/workers/store_keeper_plan.h): the store listens at 127.0.0.1:MASTER_PORT alone from before
# the workers start, held by cpprun-store-keeper, and the workers are told the agent hosts it; a
# --master_port that is taken is named at start; the keeper killed mid-job ends the job naming it,
# nothing left running (and on node 0 of a two-node job, every node's); a keeper that is missing, or a CPPRUN_STORE_KEEPER that means nothing, is
# one error saying what to do. Then torch.distributed (env://) ranks: every rank a client, rank 0
# listening at no store port, the collectives passing, under cpprun-store-keeper and under the job's
# own interpreter (CPPRUN_STORE_KEEPER=python). In a private network namespace (tests/run_isolated.sh).
. "$(dirname "$0")/common.sh"
require_private_netns
keeper_beside=$(dirname "$CPPRUN")/cpprun-store-keeper
[ -x "$keeper_beside" ] || fail "no $keeper_beside: build the cpprun-store-keeper target (cpprun depends on it)"

# The only listener at port $2 in ss's output $1 is at 127.0.0.1, held by a process named $3.
expect_store_listener() {  # ss_output_file port comm what
  local lines
  lines=$(awk -v p=":$2" '{ n = length($4) - length(p); if (n > 0 && substr($4, n + 1) == p) print }' "$1")
  [ -n "$lines" ] || fail "$4: nothing listens at port $2: $(cat "$1")"
  [ "$(printf '%s\n' "$lines" | wc -l)" = 1 ] || fail "$4: more than one listener at port $2: $lines"
  [ "$(printf '%s\n' "$lines" | awk '{print $4}')" = "127.0.0.1:$2" ] || fail "$4: the store listens beyond 127.0.0.1: $lines"
  printf '%s\n' "$lines" | grep -qF "((\"$3\"," || fail "$4: the store's listener is not $3's: $lines"
}

# 1. Shell workers: the store is there before they start, on the loopback alone, the keeper's.
worker='ss -ltnpH >"$WORK/listening.$RANK.part" && mv "$WORK/listening.$RANK.part" "$WORK/listening.$RANK"
  env >"$WORK/env.$RANK"'
cpprun --nproc_per_node=2 /bin/sh -c "$worker"
expect_eq "$?" 0 "exit code"
port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")
for rank in 0 1; do
  for var in MASTER_ADDR=127.0.0.1 "MASTER_PORT=$port" TORCHELASTIC_USE_AGENT_STORE=True; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "rank $rank: $var missing"
  done
  expect_store_listener "$WORK/listening.$rank" "$port" cpprun-store-ke "when rank $rank started"
done
expect_no_leftovers

# A dry run names the keeper it would start, and where.
cpprun --dry_run --nproc_per_node=1 --master_port=29555 /bin/true
expect_eq "$?" 0 "dry run's exit code"
expect_in_file "$WORK/out" "cpprun: the workers' c10d store: $keeper_beside (beside cpprun) would serve it at 127.0.0.1:29555" \
  "dry run's keeper line"

# 2. A --master_port that another process listens on: named at start, no worker started.
CPPRUN_TEST_TAG=$WORK python3 -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(60)' >"$WORK/held" &
holder=$!
deadline=$((SECONDS + 20))
until [ -s "$WORK/held" ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the port holder did not start"
  sleep 0.02
done
held=$(cat "$WORK/held")
cpprun --nproc_per_node=1 --master_port="$held" /bin/sh -c 'touch "$WORK/started"'
status=$?
kill "$holder"
wait "$holder" 2>/dev/null
expect_eq "$status" 1 "exit code with --master_port taken"
expect_in_file "$WORK/err" "cpprun: cannot listen for the workers' store at 127.0.0.1:$held (--master_port=$held): Address already in use" \
  "the taken port's error"
expect_in_file "$WORK/err" "leave --master_port out for a free one" "the taken port's fix"
[ ! -e "$WORK/started" ] || fail "a worker started although the store's port was taken"

# 3. The keeper killed while the workers run: the job ends at once, naming it, and nothing is left.
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 /bin/sh -c 'echo $$ >"$WORK/pid.$RANK"; exec sleep 60' \
  >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/pid.0" "$WORK/pid.1"
keeper=$(pgrep -P "$launcher" -x cpprun-store-ke)
[ -n "$keeper" ] || fail "no cpprun-store-keeper among cpprun's children: $(ps -o pid,comm --ppid "$launcher")"
kill -KILL "$keeper"
wait_node "$launcher" 30
expect_eq "$NODE_STATUS" 1 "exit code after the keeper was killed"
expect_in_file "$WORK/err" "cpprun: exiting with code 1: the workers' store keeper (pid $keeper: $keeper_beside, serving 127.0.0.1:" \
  "the keeper's end, named"
expect_in_file "$WORK/err" "killed by SIGKILL (Killed) while the workers ran: their c10d store is gone with it" \
  "how the keeper ended"
grep -q "left behind: $keeper " "$WORK/err" && fail "the keeper was taken for a leftover of the workers"
expect_no_leftovers

# The same on node 0 of a two-node job: every node ends, naming node 0's keeper.
rm -f "$WORK"/pid.*
for node in 0 1; do
  start_node "node$node" --nnodes=2 --node_rank="$node" --master_port=29559 --rdzv_conf timeout=30 \
    /bin/sh -c 'echo $$ >"$WORK/pid.$RANK"; exec sleep 60'
  eval "node$node=\$NODE_PID"
done
wait_for_files 30 "$WORK/pid.0" "$WORK/pid.1"
keeper=$(pgrep -P "$node0" -x cpprun-store-ke)
[ -n "$keeper" ] || fail "no cpprun-store-keeper among node 0's cpprun's children"
[ -z "$(pgrep -P "$node1" -x cpprun-store-ke)" ] || fail "node 1 runs a store keeper too"
kill -KILL "$keeper"
for node in 0 1; do
  wait_node "$(eval echo "\$node$node")" 30
  expect_eq "$NODE_STATUS" 1 "node $node's exit code after node 0's keeper was killed"
  expect_in_file "$WORK/node$node.err" "exiting with code 1: the workers' store keeper on node 0 (pid $keeper: " \
    "node $node's reason"
done
expect_in_file "$WORK/node1.err" "cpprun: stopping this node's workers: the workers' store keeper on node 0 (pid $keeper" \
  "node 1 told at once"
expect_no_leftovers

# 4. A keeper that is not beside cpprun: one error with the fix; CPPRUN_STORE_KEEPER points at one.
mkdir "$WORK/bin"
cp "$CPPRUN" "$WORK/bin/cpprun"
CPPRUN_TEST_TAG=$WORK "$WORK/bin/cpprun" --nproc_per_node=1 /bin/sh -c 'touch "$WORK/started"' >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 127 "exit code without a keeper"
expect_in_file "$WORK/err" "cpprun: the workers' store keeper $WORK/bin/cpprun-store-keeper does not exist" "the missing keeper"
expect_in_file "$WORK/err" "--target cpprun-store-keeper" "how to build it"
[ ! -e "$WORK/started" ] || fail "a worker started without a keeper"
CPPRUN_STORE_KEEPER=$keeper_beside CPPRUN_TEST_TAG=$WORK "$WORK/bin/cpprun" --nproc_per_node=1 \
  /bin/sh -c 'touch "$WORK/started"' >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "exit code with CPPRUN_STORE_KEEPER"
[ -e "$WORK/started" ] || fail "the worker did not run with CPPRUN_STORE_KEEPER"
CPPRUN_STORE_KEEPER=python cpprun --nproc_per_node=1 /bin/true
expect_eq "$?" 2 "exit code of CPPRUN_STORE_KEEPER=python for a program Python does not run"
expect_in_file "$WORK/err" "CPPRUN_STORE_KEEPER=python: PROGRAM '/bin/true' is not run by Python" "python keeper, no Python"
expect_no_leftovers

# 5. torch.distributed's env://: every rank a client of the keeper's store; rank 0 listens at no store port.
find_torch_python_or_skip
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
cat >"$WORK/env_init.py" <<'PY'
import datetime, os, subprocess, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:  # while every rank is in the job, the store's listeners and rank 0's pid
    work = os.environ["WORK"]
    with open(f"{work}/listening.part", "w") as out:
        out.write(subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout)
    os.rename(f"{work}/listening.part", f"{work}/listening")
    with open(f"{work}/rank0.pid", "w") as out:
        out.write(str(os.getpid()))
dist.barrier()
print(f"sum {t.item():g} agent store {os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # PyTorch 2.15's Gloo threads may abort at finalization (see python_scripts.sh)
PY
for keeper_kind in executable python; do
  rm -f "$WORK/listening" "$WORK/rank0.pid"
  comm=cpprun-store-ke
  chosen=()
  if [ "$keeper_kind" = python ]; then
    chosen=(CPPRUN_STORE_KEEPER=python)
    comm=$(basename "$python" | cut -c1-15)  # what execve named it: ps's COMM
  fi
  env "${chosen[@]}" VIRTUAL_ENV= PYTHON_EXEC="$python" CPPRUN_TEST_TAG="$WORK" timeout 200 "$CPPRUN" --nproc_per_node=4 \
    --master_port=29556 "$WORK/env_init.py" >"$WORK/out" 2>"$WORK/err"
  expect_eq "$?" 0 "the Python job's exit code ($keeper_kind keeper)"
  for rank in 0 1 2 3; do
    expect_in_file "$WORK/out" "[rank$rank]: sum 10 agent store True" "Python rank $rank's all-reduce ($keeper_kind keeper)"
  done
  expect_store_listener "$WORK/listening" 29556 "$comm" "the Python job's store ($keeper_kind keeper)"
  rank0=$(cat "$WORK/rank0.pid")
  grep -F "pid=$rank0," "$WORK/listening" | awk '{print $4}' | grep -q ':29556$' &&
    fail "Python rank 0 listens at the store's port ($keeper_kind keeper): $(cat "$WORK/listening")"
  expect_no_leftovers
done
echo PASS
