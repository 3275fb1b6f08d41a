# PyTorch's own NCCL flight recorder (issue 27): each worker's dump prefix (TORCH_FR_DUMP_TEMP_FILE and
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE) points into the attempt's nccl_flight_recorder/ dir, and a failure's
# diagnosis names the ranks that dumped there, the files and `torchfrtrace DIR -p rank_`; the user's own
# prefix is left alone. No GPU here: the workers write fake dumps where PyTorch would, then fail.
. "$(dirname "$0")/common.sh"
unset TORCH_FR_DUMP_TEMP_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE

# A worker as PyTorch's watchdog after an NCCL timeout: dump to <prefix><RANK>; rank 1 then fails once
# rank 0 has dumped too, and rank 0 waits to be stopped.
fake_dump='
  [ "$TORCH_FR_DUMP_TEMP_FILE" = "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE" ] || { echo "prefixes differ" >&2; exit 9; }
  env | grep -E "^TORCH_(FR|NCCL)_" | sort > "$WORK/torch_env.$RANK"
  printf "fake pickle of rank %s" "$RANK" > "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${RANK}" || exit 8
  if [ "$RANK" = 1 ]; then
    while [ ! -s "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}0" ]; do sleep 0.05; done
    exit 3
  fi
  sleep 30'

# ---- under --log_dir: the dumps in attempt_0/nccl_flight_recorder, named with the command ----
cpprun --nproc_per_node=2 --log_dir "$WORK/logs" /bin/sh -c "$fake_dump"
expect_eq "$?" 3 "exit code of the failing job"
run=$(run_dir_in "$WORK/logs")
dir=$run/attempt_0/nccl_flight_recorder
expect_eq "$(cat "$dir/rank_0")" "fake pickle of rank 0" "rank 0's dump where cpprun pointed it"
expect_in_file "$WORK/err" "PyTorch's NCCL flight recorder: ranks 0-1 dumped their traces in $dir: rank_0 (" "the ranks and the dir"
expect_in_file "$WORK/err" "rank_1 (" "rank 1's file"
expect_in_file "$WORK/err" "torchfrtrace $dir -p rank_" "the command that reads them"
# Only the prefix's two names are cpprun's: its own TORCH_NCCL_ASYNC_ERROR_HANDLING was there before.
expect_eq "$(cat "$WORK/torch_env.0" | tr '\n' ' ')" \
  "TORCH_FR_DUMP_TEMP_FILE=$dir/rank_ TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$dir/rank_ " \
  "rank 0's TORCH_FR_/TORCH_NCCL_ variables"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); t = d["nccl_trace"]
assert t["dir"] == sys.argv[2] and t["ranks"] == [0, 1], t
assert t["command"] == "torchfrtrace " + sys.argv[2] + " -p rank_", t
assert [f["name"] for f in t["files"]] == ["rank_0", "rank_1"] and t["unlisted"] == 0, t' \
  "$run/attempt_0/diagnosis.json" "$dir" || fail "diagnosis.json: $(cat "$run/attempt_0/diagnosis.json")"

# ---- no --log_dir: cpprun's temp dir goes, but for the dumps the diagnosis named ----
cpprun --nproc_per_node=2 /bin/sh -c "$fake_dump"
expect_eq "$?" 3 "exit code without --log_dir"
kept=$(ls -d "$WORK"/tmp/cpprun-*/attempt_0.nccl_flight_recorder 2>/dev/null)
[ -n "$kept" ] || fail "the NCCL dumps were removed with the temp dir: $(find "$WORK/tmp")"
expect_in_file "$WORK/err" "torchfrtrace $kept -p rank_" "the command names the kept dir"
expect_eq "$(ls "$kept" | tr '\n' ' ')" "rank_0 rank_1 " "the kept dumps"
expect_eq "$(ls -A "$(dirname "$kept")")" "attempt_0.nccl_flight_recorder" "nothing else kept"
rm -rf "$WORK"/tmp/cpprun-*

# ---- the user's own prefix: left as it is, and cpprun does not look there ----
mkdir "$WORK/mine"
TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$WORK/mine/trace_ cpprun --nproc_per_node=2 --log_dir "$WORK/logs2" /bin/sh -c '
  env | grep -E "^TORCH_(FR|NCCL)_" | sort > "$WORK/user_env.$RANK"
  printf x > "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${RANK}"
  if [ "$RANK" = 1 ]; then
    while [ ! -s "$WORK/user_env.0" ]; do sleep 0.05; done
    exit 3
  fi
  sleep 30'
expect_eq "$?" 3 "exit code with the user's prefix"
expect_eq "$(cat "$WORK/user_env.0" | tr '\n' ' ')" \
  "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$WORK/mine/trace_ " \
  "the user's prefix, and no TORCH_FR_DUMP_TEMP_FILE"
[ -f "$WORK/mine/trace_1" ] || fail "the worker's dump did not go where the user said"
grep -q "torchfrtrace" "$WORK/err" && fail "cpprun named dumps in a place it did not choose: $(cat "$WORK/err")"
run2=$(run_dir_in "$WORK/logs2")
[ -e "$run2/attempt_0/nccl_flight_recorder" ] && fail "cpprun made a dump dir though the user chose the prefix"

# ---- a job that dumps nothing (Gloo, CPU): no dir left, no diagnosis, torchrun's --log_dir tree ----
cpprun --nproc_per_node=2 --log_dir "$WORK/logs3" /bin/sh -c '[ "$RANK" = 1 ] && exit 4; sleep 30'
expect_eq "$?" 4 "exit code of a job that dumps nothing"
run3=$(run_dir_in "$WORK/logs3")
[ -e "$run3/attempt_0/nccl_flight_recorder" ] && fail "an empty nccl_flight_recorder dir was left in the log dir"
grep -q "diagnosis" "$WORK/err" && fail "a diagnosis without any dump: $(cat "$WORK/err")"
expect_no_leftovers

# ---- a relative --log_dir and a worker that changes directory first (Hydra's chdir): the prefix is absolute,
# so the dump still lands where the diagnosis looks; TORCHELASTIC_ERROR_FILE stays relative, as torchrun's ----
(cd "$WORK" && cpprun --nproc_per_node=1 --log_dir rel_logs /bin/sh -c '
  echo "$TORCHELASTIC_ERROR_FILE" > "$WORK/rel_error_file"
  mkdir -p "$WORK/elsewhere" && cd "$WORK/elsewhere" || exit 9
  printf "dump after chdir" > "${TORCH_FR_DUMP_TEMP_FILE}${RANK}" || exit 8
  exit 3')
expect_eq "$?" 3 "exit code of the job that changed directory"
run5=$(run_dir_in "$WORK/rel_logs")
expect_eq "$(cat "$run5/attempt_0/nccl_flight_recorder/rank_0")" "dump after chdir" "the dump of a worker that chdir'd"
expect_in_file "$WORK/err" "rank 0 dumped its trace in $run5/attempt_0/nccl_flight_recorder" "the diagnosis names it"
expect_eq "$(cat "$WORK/rel_error_file")" "rel_logs/${run5##*/}/attempt_0/0/error.json" "the error file, relative"

# ---- a real dump, read by PyTorch's reader with the very command cpprun printed ----
# nccl_trace_h100_rank_0.pickle: what PyTorch 2.11 (cu130) wrote on an H100 for a one-rank watchdog
# timeout (an all_reduce queued behind torch.cuda._sleep, 5 s timeout), with the prefix cpprun sets.
real=$(dirname "$0")/nccl_trace_h100_rank_0.pickle
cpprun --nproc_per_node=1 --log_dir "$WORK/logs4" /bin/sh -c 'cp "$0" "${TORCH_FR_DUMP_TEMP_FILE}${RANK}"; exit 1' "$real"
expect_eq "$?" 1 "exit code of the job with a real dump"
expect_in_file "$WORK/err" "rank 0 dumped its trace in" "the real dump named"
command=$(sed -n 's/^cpprun: .*cpprun does not open them): //p' "$WORK/err")
[ -n "$command" ] || fail "no torchfrtrace command printed: $(cat "$WORK/err")"
find_torch_python_or_skip
PATH=$(dirname "$python"):$PATH
command -v torchfrtrace >/dev/null || { echo "SKIP: no torchfrtrace beside $python; the cpprun parts passed"; exit 77; }
eval "$command" >"$WORK/frtrace.out" 2>&1 || fail "PyTorch's reader failed on the printed command ($command): $(tail -5 "$WORK/frtrace.out")"
# It did read the file: the same directory under another prefix has nothing for it.
eval "${command%rank_}nope_" >"$WORK/frtrace.out" 2>&1 && fail "torchfrtrace read nothing yet succeeded: the check above proves nothing"
expect_in_file "$WORK/frtrace.out" "no files loaded" "torchfrtrace's own refusal under another prefix"
echo PASS
