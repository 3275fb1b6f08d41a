#!/usr/bin/env bash
# Two cpprun agents as two nodes of one static job (1 worker each) on the loopback, run from /:
# the installed launcher, from any directory, with nothing of the build tree's.
#   usage: two_nodes.sh PATH/TO/installed/cpprun PATH/TO/consumer
set -euo pipefail
cpprun=$1 consumer=$2
cd /
CPPRUN_JOB_SECRET=consumer-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export CPPRUN_JOB_SECRET
# A free port (in the test's own network namespace any port is; elsewhere ask the kernel).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(--nnodes=2 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port="$port" --rdzv_conf=timeout=60)
timeout 120 "$cpprun" "${common[@]}" --node_rank=1 "$consumer" &
node1=$!
status=0
timeout 120 "$cpprun" "${common[@]}" --node_rank=0 "$consumer" || status=$?
wait "$node1" || status=$?
exit "$status"
