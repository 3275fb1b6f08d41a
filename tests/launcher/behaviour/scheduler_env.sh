# Under a (faked) Slurm job, cpprun takes --nnodes, --node_rank and --master_addr from SLURM_*,
# says so on stderr, and explicit flags still win. The dry run shows the MASTER_ADDR the workers
# get: with the job secret their agent's end of the store tunnel on the loopback (it showed
# --master_addr, which they get only with --no_job_secret).
. "$(dirname "$0")/common.sh"
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT \
      SLURM_STEP_NUM_TASKS
export SLURM_JOB_ID=1 SLURM_NNODES=2 SLURM_NODEID=1 SLURM_JOB_NODELIST='node[01-02]'

cpprun --dry_run --nproc_per_node=2 /bin/true
expect_eq "$?" 0 "exit code"
expect_in_file "$WORK/err" "cpprun: from Slurm: --nnodes=2 --node_rank=1 --master_addr=node01" "where the values came from"
expect_eq "$(grep -c '^rank [23] (local_rank [01]):$' "$WORK/out")" 2 "ranks 2 and 3 on node rank 1"
for var in RANK=2 RANK=3 WORLD_SIZE=4 GROUP_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500; do
  expect_in_file "$WORK/out" "    $var" "$var"
done
cpprun --dry_run --nproc_per_node=2 --no_job_secret /bin/true
expect_in_file "$WORK/out" "    MASTER_ADDR=node01" "--master_addr from Slurm, without the secret"

# Explicit flags win.
cpprun --dry_run --nproc_per_node=2 --master_addr=10.1.2.3 --no_job_secret /bin/true
expect_eq "$?" 0 "exit code with --master_addr"
expect_in_file "$WORK/out" "    MASTER_ADDR=10.1.2.3" "explicit --master_addr"
expect_in_file "$WORK/err" "cpprun: from Slurm: --nnodes=2 --node_rank=1" "note without master_addr"

# A broken value is a usage error naming the variable.
SLURM_NODEID=5 cpprun --dry_run /bin/true
expect_eq "$?" 2 "exit code for a bad SLURM_NODEID"
expect_in_file "$WORK/err" "SLURM_NODEID=5" "error names the variable"
expect_no_leftovers
echo PASS
