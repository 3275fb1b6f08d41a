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
             MASTER_ADDR=127.0.0.1 TORCHELASTIC_RESTART_COUNT=0 \
             TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_USE_AGENT_STORE=True \
             OMP_NUM_THREADS=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 \
             TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT \
             "CPPRUN_TEST_TAG=$WORK"; do
    grep -qxF "$var" "$env_file" || fail "rank $rank: $var missing; got: $(grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_)' "$env_file" | tr '\n' ' ')"
  done
  ! grep -q '^NCCL_ASYNC_ERROR_HANDLING=' "$env_file" || fail "rank $rank: the deprecated NCCL_ASYNC_ERROR_HANDLING was set (torchrun 2.x sets only TORCH_NCCL_ASYNC_ERROR_HANDLING)"
  expect_eq "$(cat "$WORK/args.$rank")" "--lr|0.1|--nproc_per_node|9|-h|" "rank $rank arguments"
done

# One node without --master_port: as torchrun 2.x, a free port and a random (uuid4) run id, the same
# for every rank; two such jobs at once do not collide.
port0=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")
id0=$(sed -n 's/^TORCHELASTIC_RUN_ID=//p' "$WORK/env.0")
for rank in 1 2; do
  expect_eq "$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.$rank")" "$port0" "rank $rank's MASTER_PORT"
  expect_eq "$(sed -n 's/^TORCHELASTIC_RUN_ID=//p' "$WORK/env.$rank")" "$id0" "rank $rank's TORCHELASTIC_RUN_ID"
done
[ "$port0" != 29500 ] || fail "MASTER_PORT=29500 without --master_port"
printf '%s\n' "$id0" | grep -qE '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' ||
  fail "TORCHELASTIC_RUN_ID=$id0 is not a uuid4"
CPPRUN_TEST_TAG=$WORK "$CPPRUN" /bin/sh -c 'echo "$MASTER_PORT $TORCHELASTIC_RUN_ID" > "$WORK/job.a"; sleep 0.3' \
  >/dev/null 2>&1 &
job_a=$!
cpprun /bin/sh -c 'echo "$MASTER_PORT $TORCHELASTIC_RUN_ID" > "$WORK/job.b"; sleep 0.3'
wait "$job_a"
read -r port_a id_a <"$WORK/job.a"
read -r port_b id_b <"$WORK/job.b"
[ "$port_a" != "$port_b" ] && [ "$id_a" != "$id_b" ] || fail "two default jobs share MASTER_PORT=$port_a or a run id"
# With --master_port, torchrun's static defaults: that port and run id none.
cpprun --master_port=29500 /bin/sh -c 'env > "$WORK/static"'
grep -qxF MASTER_PORT=29500 "$WORK/static" || fail "--master_port=29500 not kept"
grep -qxF TORCHELASTIC_RUN_ID=none "$WORK/static" || fail "run id not none with --master_port"

# --virtual_local_rank: LOCAL_RANK=0, each worker one GPU of CUDA_VISIBLE_DEVICES (no GPU needed to see it).
CUDA_VISIBLE_DEVICES=5,7 cpprun --nproc_per_node=2 --virtual-local-rank /bin/sh -c 'env > "$WORK/v.$RANK"'
expect_eq "$?" 0 "--virtual_local_rank exit code"
grep -qxF LOCAL_RANK=0 "$WORK/v.1" || fail "--virtual_local_rank: LOCAL_RANK of rank 1"
grep -qxF CUDA_VISIBLE_DEVICES=7 "$WORK/v.1" || fail "--virtual_local_rank: CUDA_VISIBLE_DEVICES of rank 1"

# The user's values win; --standalone picks 127.0.0.1 and a port of its own.
OMP_NUM_THREADS=7 NCCL_ASYNC_ERROR_HANDLING=0 cpprun --standalone --nproc-per-node 2 --role=trainer \
  --master_port=1234 /bin/sh -c 'env > "$WORK/sa.$LOCAL_RANK"'
expect_eq "$?" 0 "standalone exit code"
grep -qxF OMP_NUM_THREADS=7 "$WORK/sa.1" || fail "user's OMP_NUM_THREADS not kept"
grep -qxF NCCL_ASYNC_ERROR_HANDLING=0 "$WORK/sa.1" || fail "user's NCCL_ASYNC_ERROR_HANDLING not kept"
# torchrun's agent reads only the TORCH_ name: the old one set to 0 leaves async error handling on.
grep -qxF TORCH_NCCL_ASYNC_ERROR_HANDLING=1 "$WORK/sa.1" || fail "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 not set over NCCL_ASYNC_ERROR_HANDLING=0"
grep -qxF ROLE_NAME=trainer "$WORK/sa.1" || fail "--role not exported"
grep -qxF MASTER_ADDR=127.0.0.1 "$WORK/sa.0" || fail "standalone MASTER_ADDR"
port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/sa.0")
[ "$port" != 1234 ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || fail "standalone MASTER_PORT=$port"
expect_eq "$(sed -n 's/^MASTER_PORT=//p' "$WORK/sa.1")" "$port" "both ranks' MASTER_PORT"
expect_no_leftovers
echo PASS
