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

expect_no_leftovers
echo PASS
