# A node that holds the job secret but breaks the store tunnel's rules (Note [Store tunnel flow
# control]) cannot make the host agent misbehave: for each hostile sequence cpprun_link_probe ($2)
# sends as node 1 once the round started, the host names the violation, loses node 1, ends the job
# within seconds with that reason, leaves nothing running, and its memory peak grows by less than
# 40 MiB. Every listener is on the loopback (the nodes are all on this host).
. "$(dirname "$0")/common.sh"
require_private_netns
PROBE=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_link_probe}
max_growth_kib=$((40 * 1024))

# A store keeper (CPPRUN_STORE_KEEPER) that closes the store's listening socket, says so by creating
# $keeper_closed, and then lives as long as cpprun holds its standard input. The probe sends only
# once that file exists (CPPRUN_PROBE_SEND_AFTER), so every store connection the host makes for a
# channel is refused and retried: the channel stays connecting, and nothing the probe sends is
# written to the store, nor credited back. With the real keeper the host writes the bytes as they
# come once the connection is up, and credits them (Note [Store tunnel flow control]); whether that
# happened before the probe's last byte depended on timing, and so did over_credit's verdict.
closed_keeper=$WORK/closed_store_keeper.sh
keeper_closed=$WORK/store_keeper_closed
printf '#!/bin/sh\nexec 3<&-\n: >"%s"\nexec cat >/dev/null\n' "$keeper_closed" >"$closed_keeper"
chmod +x "$closed_keeper"

# run_case SEQUENCE PORT TEXT [KEEPER]: TEXT is what node 0 must say about the violation; KEEPER,
# the store keeper node 0 runs (default: cpprun's own).
run_case() {
  local sequence=$1 port=$2 text=$3 keeper=${4:-} node0 started growth
  # Node 0's worker never uses the store, and takes half a second to stop, so that node 0 is still
  # there when the probe reads its memory.
  rm -f "$keeper_closed"
  if [ -n "$keeper" ]; then export CPPRUN_STORE_KEEPER=$keeper; else unset CPPRUN_STORE_KEEPER; fi
  start_node node0 --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port="$port" \
    --rdzv_id=tunnel-hostile --max_restarts=0 \
    /bin/sh -c 'trap "sleep 0.5; exit 143" TERM; while :; do sleep 0.1; done'
  unset CPPRUN_STORE_KEEPER
  node0=$NODE_PID
  wait_for_listener "$node0" "$port" 10
  CPPRUN_TEST_TAG=$WORK CPPRUN_PROBE_SEND_AFTER=${keeper:+$keeper_closed} \
    timeout 40 "$PROBE" "$sequence" 127.0.0.1 "$port" tunnel-hostile "$node0" \
    >"$WORK/probe_$sequence.out" 2>&1
  local probe_status=$?
  started=$SECONDS
  cat "$WORK/probe_$sequence.out"
  expect_in_file "$WORK/probe_$sequence.out" "round 0 started" "$sequence: the probe's round"
  expect_eq "$probe_status" 0 "$sequence: the probe's exit code (the host closed the link)"
  # Within 10 s of the probe's end (it takes well under one; the bound is for a loaded 2-core CI
  # machine, $SECONDS counting whole seconds): wait_node's own limit is past it, so the check says how long.
  wait_node "$node0" 20
  [ $((SECONDS - started)) -le 10 ] || fail "$sequence: node 0 took $((SECONDS - started)) s to end the job"
  [ "$NODE_STATUS" != 0 ] || fail "$sequence: node 0 exited 0 after node 1's violation"
  expect_in_file "$WORK/node0.err" "$text" "$sequence: node 0 names the violation"
  grep -q "node 1" "$WORK/node0.err" || fail "$sequence: node 0 does not name node 1"
  growth=$(sed -n 's/.*growth \(-\{0,1\}[0-9]*\) KiB.*/\1/p' "$WORK/probe_$sequence.out")
  [ -n "$growth" ] || fail "$sequence: no memory reading from the probe"
  [ "$growth" -lt "$max_growth_kib" ] ||
    fail "$sequence: node 0's memory peak grew by $growth KiB (bound $max_growth_kib)"
  expect_no_leftovers
  echo "ok: $sequence: $(grep -F "$text" "$WORK/node0.err" | head -1)"
}

run_case over_credit 29640 "sent 1 bytes for channel 1 beyond its credit: 0 of its 131072-byte window were left" \
  "$closed_keeper"
run_case data_unopened 29641 "sent \`data\` for channel 7, which was never opened"
run_case credit_unopened 29642 "sent \`credit\` for channel 7, which was never opened"
run_case close_unopened 29643 "sent \`close\` for channel 7, which was never opened"
run_case credit_unsent 29644 "credited 4096 bytes back for channel 1, but 0 were sent and not yet credited"
run_case open_skipped 29645 "sent \`open\` for channel 2, but the next channel is 1"
run_case open_reused 29646 "sent \`open\` for channel 1, but the next channel is 2"
run_case open_past_cap 29647 "opened channel 257 while 256 were open; at most 256 may be"
run_case chunk_too_big 29648 "sent data for channel 1 of 49153 bytes, more than the 49152 one message may carry"
run_case bad_base64 29649 "sent data for channel 1 that is not base64"
echo "PASS"
