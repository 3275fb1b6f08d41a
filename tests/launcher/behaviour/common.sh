# Sourced by the behaviour tests: runs the real cpprun binary ($1), gives the test a private temp
# dir ($WORK), and on exit kills anything the test started that is still alive, then removes $WORK.
#
# Every cpprun under test runs with CPPRUN_TEST_TAG=$WORK in its environment, which its workers
# inherit; that tag is how leftovers() finds processes without trusting pids that may be reused.
set -u

CPPRUN=${1:?usage: $0 PATH/TO/cpprun}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cpprun-test.XXXXXX")
export WORK
# cpprun's per-run temp dir lands here, so expect_no_leftovers can see that it was removed.
mkdir "$WORK/tmp"
export TMPDIR=$WORK/tmp
unset OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_ASYNC_ERROR_HANDLING
# Multi-node agents prove this to each other (Note [Agent authentication]); one per test, as a job
# would have one per job.
CPPRUN_JOB_SECRET=cpprun-test-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export CPPRUN_JOB_SECRET
unset $(env | sed -n 's/^\(PET_[A-Za-z0-9_]*\)=.*/\1/p')  # torchrun-style option overrides

cleanup() {
  local pid
  for pid in $(leftovers); do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Runs cpprun with the tag; stdout and stderr go to $WORK/out and $WORK/err.
cpprun() {
  CPPRUN_TEST_TAG=$WORK "$CPPRUN" "$@" >"$WORK/out" 2>"$WORK/err"
}

# Pids of live processes (zombies have no environment) carrying this test's tag.
leftovers() {
  local environ
  for environ in /proc/[0-9]*/environ; do
    if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qxF "CPPRUN_TEST_TAG=$WORK"; then
      environ=${environ#/proc/}
      echo "${environ%/environ}"
    fi
  done
}

fail() {
  echo "FAIL: $*" >&2
  for f in out err; do
    [ -s "$WORK/$f" ] && { echo "--- cpprun std$f:" >&2; cat "$WORK/$f" >&2; }
  done
  for f in "$WORK"/node*.out "$WORK"/node*.err; do
    [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; cat "$f" >&2; }
  done
  exit 1
}

expect_eq() {  # actual expected what
  [ "$1" = "$2" ] || fail "$3: expected '$2', got '$1'"
}

expect_in_file() {  # file text what
  grep -qF -- "$2" "$1" || fail "$3: '$2' not in $(basename "$1")"
}

# The one run directory torchrun's layout puts in log dir $1: $1/RUN_ID_XXXXXXXX (8 characters of
# Python's mkdtemp). Fails unless there is exactly one, its id being $2 if given.
run_dir_in() {  # log_dir [run_id]
  local dirs
  dirs=$(find "$1" -mindepth 1 -maxdepth 1 -type d 2>/dev/null)
  [ -n "$dirs" ] && [ "$(printf '%s\n' "$dirs" | wc -l)" -eq 1 ] || fail "expected one run dir in $1, found: '$dirs'"
  local name=${dirs##*/}
  printf '%s\n' "$name" | grep -qE "^${2:-.+}_[a-z0-9_]{8}\$" || fail "run dir $name is not RUN_ID_XXXXXXXX"
  echo "$dirs"
}

expect_no_leftovers() {
  local left
  left=$(leftovers)
  [ -z "$left" ] || fail "processes left behind: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline"; echo "(pid $p)"; done)"
  left=$(ls -A "$WORK/tmp")
  [ -z "$left" ] || fail "temp files left behind in \$TMPDIR: $left"
}

# The same, allowing $1 seconds for the leftovers to go: after cpprun was SIGKILLed, its guardian
# (which carries the tag too) is still sweeping for a moment.
expect_no_leftovers_within() {
  local deadline=$((SECONDS + $1))
  while [ -n "$(leftovers)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
  expect_no_leftovers
}

# Every line of $1 matches the extended regex $2.
expect_all_lines() {  # file regex what
  local bad
  bad=$(grep -cvE -- "$2" "$1")
  [ "$bad" = 0 ] || fail "$3: $bad lines of $(basename "$1") do not match $2, e.g. '$(grep -vE -- "$2" "$1" | head -1 | cut -c1-120)'"
}

# Waits up to $1 seconds for every following file to exist.
wait_for_files() {
  local deadline=$((SECONDS + $1)) f
  shift
  for f in "$@"; do
    while [ ! -e "$f" ]; do
      [ "$SECONDS" -lt "$deadline" ] || fail "timed out waiting for $f"
      sleep 0.05
    done
  done
}

# Waits up to $1 seconds for file $2 to contain the text $3.
wait_for_text() {
  local deadline=$((SECONDS + $1))
  until grep -qF -- "$3" "$2" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out waiting for '$3' in $(basename "$2")"
    sleep 0.05
  done
}

# A live process that is not a zombie.
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

now_ms() { date +%s%3N; }

# Sets $MARK to the latest of the time marks (now_ms's Unix milliseconds, one a file) in the files
# given; fails, naming `what`, unless every one is there. A timed bound starts at such a mark,
# written when its fault was reached, never before start-up: a loaded machine may take seconds to
# start a job.
latest_mark() {  # what file...
  local what=$1 f mark
  shift
  MARK=0
  for f in "$@"; do
    mark=$(cat "$f" 2>/dev/null)
    [[ $mark =~ ^[0-9]+$ ]] || fail "$what: no time mark in $(basename "$f")"
    [ "$mark" -gt "$MARK" ] && MARK=$mark
  done
}

# ended_between WHAT ENDED_MS MIN_MS MAX_MS FILE...: a job that should end at a timeout, neither
# before it nor long after: ELAPSED is ENDED_MS less the latest mark in FILE..., and it must be at
# least MIN_MS and below MAX_MS. WHAT names the mark in the failures ("rank 1 began waiting").
ended_between() {
  local what=$1 ended=$2 min=$3 max=$4
  shift 4
  latest_mark "$what" "$@"
  ELAPSED=$((ended - MARK))
  [ "$ELAPSED" -ge "$min" ] || fail "ended $ELAPSED ms after $what, before the $min ms it should wait"
  [ "$ELAPSED" -lt "$max" ] || fail "took $ELAPSED ms after $what, at most $max ms expected"
}

# ---- multi-node: several cpprun agents on this host, one per node ----

# Multi-node tests need a network namespace of their own (tests/run_isolated.sh makes one as root):
# c10d's store, which node 0's agent hosts, listens on every interface, and only there may a test
# bind to more than the loopback. Exits with 77 (ctest's SKIP_RETURN_CODE) elsewhere.
require_private_netns() {
  # /sys/class/net would show the namespace sysfs was mounted in; ip asks the kernel.
  if [ "$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}')" != lo ]; then
    echo "SKIP: needs a private network namespace with only the loopback (run as root under tests/run_isolated.sh)"
    exit 77
  fi
}

# Starts cpprun in the background as one node: `start_node NAME ARGS...`. Its stdout and stderr go
# to $WORK/NAME.out and $WORK/NAME.err; its pid is in $NODE_PID.
start_node() {
  local name=$1
  shift
  # Emptied here, not only by the background job's redirection: that may run later, and a
  # wait_for_text meanwhile would read an earlier node of the same name.
  : >"$WORK/$name.out"
  : >"$WORK/$name.err"
  CPPRUN_TEST_TAG=$WORK "$CPPRUN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  NODE_PID=$!
}

# Waits at most $2 seconds for the background cpprun $1 to exit; its exit status is in $NODE_STATUS.
wait_node() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && alive "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "cpprun (pid $1) still running after $2 s"
    sleep 0.05
  done
  wait "$1"
  NODE_STATUS=$?
}

# Sets $python to a python that can import torch.distributed ($CPPRUN_TORCH_PYTHON, set by ctest
# to the project's .venv, else python3 on PATH), or ends the test as skipped (77), saying why: the
# parts before it passed, but a test missing a part is not reported as passed.
find_torch_python_or_skip() {
  python=
  for candidate in ${CPPRUN_TORCH_PYTHON:-} python3; do
    if "$candidate" -c 'import torch.distributed' 2>/dev/null; then
      python=$(command -v "$candidate")
      return
    fi
  done
  echo "SKIP: the torch.distributed part needs a python that imports torch (run scripts/setup.sh," \
       "or configure with -DCPPRUN_TORCH_PYTHON=...); the cpprun parts before it passed"
  exit 77
}

# Ends the test as skipped (77), saying why, unless it can make network namespaces of its own:
# root and iproute2's `ip netns`.
netns_or_skip() {
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: creating network namespaces needs root"
    exit 77
  fi
  if ! command -v ip >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: 'ip netns' is not available (install iproute2)"
    exit 77
  fi
}

# ---- events that order a test's steps, in place of sleeps ----

# Waits up to $3 seconds for the process whose pid is written in file $1 to run the program
# named $2 (e.g. after `exec sleep`).
wait_for_exec() {  # pid_file comm seconds
  local deadline=$((SECONDS + $3)) pid=
  until [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "pid '$pid' ($(basename "$1")) does not run $2 after $3 s"
    sleep 0.02
    pid=$(cat "$1" 2>/dev/null)
  done
}

# Waits up to $2 seconds for the pid written in file $1 to be reaped: gone from /proc, not a
# zombie, so its parent (a cpprun agent) has seen it exit.
wait_reaped() {  # pid_file seconds
  local deadline=$((SECONDS + $2)) pid
  until [ -s "$1" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no pid in $(basename "$1") after $2 s"
    sleep 0.02
  done
  pid=$(cat "$1")
  while [ -e "/proc/$pid" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "pid $pid ($(basename "$1")) not reaped after $2 s"
    sleep 0.02
  done
}

# Waits up to $2 seconds for an agent that starts before its host to try to reach it at
# 127.0.0.1:$1: listens there itself, takes the first connection and resets it without a word,
# and stops listening (no TIME_WAIT is left to block the host's port). The agent then tries again
# until the host comes (Note [Pending links under a flood]), and says so once on its stderr.
# So "this node came first" is an event the test saw, not a sleep's guess. The reset waits for the
# agent's first bytes (its hello), or 1 s: one that came at once could reach the agent before its
# connect() had reported success, and a connect that fails is retried without a word (CI saw it
# once in 2026-12-02's run).
wait_for_connect_attempt() {  # port seconds
  python3 - "$1" "$2" <<'PY' || fail "nothing tried to connect to 127.0.0.1:$1 within $2 s"
import socket, struct, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(1)
server.settimeout(float(sys.argv[2]))
peer, _ = server.accept()
peer.settimeout(1.0)
try:
    peer.recv(1)  # the agent's hello: its connect() has succeeded
except OSError:
    pass
peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
peer.close()
server.close()
PY
}

wait_for_listener() {  # pid port seconds: until process pid listens on TCP port
  local deadline=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | grep -q ":$2\$" && return 0
    sleep 0.05
  done
  fail "process $1 does not listen on port $2 after $3 s: $(ss -ltnpH 2>/dev/null | grep "pid=$1,")"
}
