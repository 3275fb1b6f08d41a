# (a) Every worker gets torchrun's environment with distinct ranks, and its arguments untouched.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=3 /bin/sh -c 'env > "$WORK/env.$RANK"; printf "%s|" "$@" > "$WORK/args.$RANK"' \
  sh --lr 0.1 --nproc_per_node 9 -h
expect_eq "$?" 0 "exit code"
expect_in_file "$WORK/err" "OMP_NUM_THREADS=1" "OMP notice"

for rank in 0 1 2; do
  env_file=$WORK/env.$rank
  [ -f "$env_file" ] || fail "rank $rank did not run"
  for var in "RANK=$rank" "LOCAL_RANK=$rank" WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 \
             GROUP_WORLD_SIZE=1 "ROLE_RANK=$rank" ROLE_WORLD_SIZE=3 ROLE_NAME=default \
             MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 TORCHELASTIC_RESTART_COUNT=0 \
             TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE=False \
             OMP_NUM_THREADS=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 \
             "CPPRUN_TEST_TAG=$WORK"; do
    grep -qxF "$var" "$env_file" || fail "rank $rank: $var missing; got: $(grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_)' "$env_file" | tr '\n' ' ')"
  done
  ! grep -q '^NCCL_ASYNC_ERROR_HANDLING=' "$env_file" || fail "rank $rank: the deprecated NCCL_ASYNC_ERROR_HANDLING was set (torchrun 2.x sets only TORCH_NCCL_ASYNC_ERROR_HANDLING)"
  expect_eq "$(cat "$WORK/args.$rank")" "--lr|0.1|--nproc_per_node|9|-h|" "rank $rank arguments"
done

# The user's values win; --standalone picks 127.0.0.1 and a port of its own.
OMP_NUM_THREADS=7 NCCL_ASYNC_ERROR_HANDLING=0 cpprun --standalone --nproc-per-node 2 --role=trainer \
  --master_port=1234 /bin/sh -c 'env > "$WORK/sa.$LOCAL_RANK"'
expect_eq "$?" 0 "standalone exit code"
grep -qxF OMP_NUM_THREADS=7 "$WORK/sa.1" || fail "user's OMP_NUM_THREADS not kept"
grep -qxF NCCL_ASYNC_ERROR_HANDLING=0 "$WORK/sa.1" || fail "user's NCCL_ASYNC_ERROR_HANDLING not kept"
grep -qxF ROLE_NAME=trainer "$WORK/sa.1" || fail "--role not exported"
grep -qxF MASTER_ADDR=127.0.0.1 "$WORK/sa.0" || fail "standalone MASTER_ADDR"
port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/sa.0")
[ "$port" != 1234 ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || fail "standalone MASTER_PORT=$port"
expect_eq "$(sed -n 's/^MASTER_PORT=//p' "$WORK/sa.1")" "$port" "both ranks' MASTER_PORT"
expect_no_leftovers
echo PASS
