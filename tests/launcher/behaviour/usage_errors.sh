# (h) Command-line mistakes: exit 2 with the flag named; a missing PROGRAM (or its #! interpreter, or
# the NAME of its #!/usr/bin/env NAME): 127
# with its name.
. "$(dirname "$0")/common.sh"

cpprun --bogus /bin/true
expect_eq "$?" 2 "unknown flag exit code"
expect_in_file "$WORK/err" "--bogus" "unknown flag named"
expect_in_file "$WORK/err" "--help" "usage hint"

cpprun --nproc_per_node=0 /bin/true
expect_eq "$?" 2 "bad value exit code"
expect_in_file "$WORK/err" "--nproc_per_node=0" "bad value named"

cpprun --master-port=70000 /bin/true
expect_eq "$?" 2 "bad port exit code"
expect_in_file "$WORK/err" "--master_port=70000" "bad port named"

cpprun --nproc_per_node=2
expect_eq "$?" 2 "missing PROGRAM exit code"
expect_in_file "$WORK/err" "missing PROGRAM" "missing PROGRAM message"

# Said in cpprun's words, not CLI11's ("Could not convert: --run_path = train.py", "1 required ... missing").
cpprun --run_path=train.py
expect_eq "$?" 2 "a flag given a value: exit code"
expect_in_file "$WORK/err" "cpprun: --run_path is a flag and takes no value (--run_path=train.py was given)" \
  "a flag given a value"
cpprun --nproc_per_node
expect_eq "$?" 2 "a missing value: exit code"
expect_in_file "$WORK/err" "cpprun: --nproc_per_node expects a value (N, auto, cpu or gpu)" "a missing value"

cpprun --nproc_per_node=2 cpprun-no-such-program --x
expect_eq "$?" 127 "program not on PATH"
expect_in_file "$WORK/err" "cpprun-no-such-program" "missing program named"

cpprun "$WORK/nope"
expect_eq "$?" 127 "missing program path"
# As torchrun's @record main: the launcher's own failure in its TORCHELASTIC_ERROR_FILE, for a
# scheduler to read (none was written before).
TORCHELASTIC_ERROR_FILE="$WORK/launcher_error.json" cpprun "$WORK/nope"
expect_eq "$?" 127 "missing program path, with an error file"
expect_in_file "$WORK/launcher_error.json" "{\"message\": {\"message\": \"cpprun: cannot run PROGRAM '$WORK/nope'" \
  "the launcher's error file"
expect_in_file "$WORK/launcher_error.json" '"py_callstack": "", "timestamp": "' "the launcher's error file's extraInfo"

touch "$WORK/not-executable"
cpprun "$WORK/not-executable"
expect_eq "$?" 126 "non-executable program"

printf 'not a program\n' > "$WORK/garbage"
chmod +x "$WORK/garbage"
cpprun --nproc_per_node=2 "$WORK/garbage"
expect_eq "$?" 126 "exec format error"
expect_in_file "$WORK/err" "execve() failed" "exec failure explained"
# torchrun runs it with python; cpprun says what it may be and how to run it.
expect_in_file "$WORK/err" "a Python script without the .py ending? Run \`cpprun ... python3 $WORK/garbage ...\`" \
  "the hint at an exec format error"

# A script whose #! interpreter is missing: named with its interpreter before any worker starts,
# 127 as a shell says (execve's ENOENT would blame the script, which is there).
printf '#!/no/such/interp\ntouch started\n' >"$WORK/train.sh"
chmod +x "$WORK/train.sh"
(cd "$WORK" && cpprun --nproc_per_node=2 ./train.sh)
expect_eq "$?" 127 "missing #! interpreter's exit code"
expect_in_file "$WORK/err" \
  "cpprun: cannot run PROGRAM './train.sh': its interpreter '/no/such/interp' (from its #! line) does not exist" \
  "missing #! interpreter named"
printf '#!/bin/sh\r\ntouch started\r\n' >"$WORK/dos.sh"
chmod +x "$WORK/dos.sh"
cpprun "$WORK/dos.sh"
expect_eq "$?" 127 "#! line with a carriage return's exit code"
expect_in_file "$WORK/err" "its interpreter '/bin/sh\\r' (from its #! line) does not exist: the #! line ends in a carriage return" \
  "carriage return named"
# #!/usr/bin/env NAME: env is there, NAME is not on PATH; named before any worker starts (each
# worker's env would say "No such file or directory" and exit 127), 127 as env's.
printf '#!/usr/bin/env cpprun-no-such-interpreter\ntouch started\n' >"$WORK/env.sh"
chmod +x "$WORK/env.sh"
(cd "$WORK" && cpprun --nproc_per_node=2 ./env.sh)
expect_eq "$?" 127 "#!/usr/bin/env NAME not on PATH's exit code"
expect_in_file "$WORK/err" "cpprun: cannot run PROGRAM './env.sh': its #! line (#!/usr/bin/env cpprun-no-such-interpreter) \
has env run 'cpprun-no-such-interpreter', which is not on PATH" "env's missing program named"
[ ! -e "$WORK/started" ] || fail "a script with a missing interpreter ran"

cpprun --help
expect_eq "$?" 0 "--help exit code"
expect_in_file "$WORK/out" "Usage: cpprun [OPTIONS] PROGRAM [ARGS...]" "help usage line"
expect_in_file "$WORK/out" "--nproc_per_node,--nproc-per-node" "help lists both spellings"

# torchrun's options that cpprun checks as torchrun does: bad values are usage errors, like argparse's.
cpprun --start_method=thread /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--start_method=thread exit code"
expect_in_file "$WORK/err" "--start_method=thread: expected one of spawn, fork, forkserver" "--start_method message"
# A name that is not a signal's: torchrun warns and runs the job; so does cpprun.
cpprun --signals-to-handle=SIGNOPE /bin/true
expect_eq "$?" 0 "--signals_to_handle=SIGNOPE exit code (torchrun warns and runs)"
expect_in_file "$WORK/err" "'SIGNOPE' is not a signal name" "--signals_to_handle note"
# A real signal cpprun does not catch: run, exported, and said as such (not "not a signal name").
cpprun --signals_to_handle=SIGTERM,SIGWINCH /bin/sh -c 'echo "$TORCHELASTIC_SIGNALS_TO_HANDLE"'
expect_eq "$?" 0 "--signals_to_handle=SIGTERM,SIGWINCH exit code"
expect_in_file "$WORK/out" "SIGTERM,SIGWINCH" "SIGWINCH exported"
expect_in_file "$WORK/err" "SIGWINCH is exported in TORCHELASTIC_SIGNALS_TO_HANDLE but not caught" "SIGWINCH note"
grep -q "not a signal name" "$WORK/err" && fail "SIGWINCH called not a signal name: $(cat "$WORK/err")"
# No process can catch SIGKILL: torchrun fails starting its workers; cpprun refuses it.
cpprun --signals_to_handle=SIGTERM,SIGKILL /bin/true
expect_eq "$?" 2 "--signals_to_handle=SIGTERM,SIGKILL exit code"
expect_in_file "$WORK/err" "SIGKILL cannot be caught by any process" "SIGKILL refused"
CUDA_VISIBLE_DEVICES=0 cpprun --virtual_local_rank --nproc_per_node=2 /bin/true
expect_eq "$?" 2 "--virtual_local_rank with too few GPUs exit code"
expect_in_file "$WORK/err" "CUDA_VISIBLE_DEVICES=0, which lists 1 for --nproc_per_node=2" "--virtual_local_rank message"
# --logs_specs: torchrun's entry point 'default' only, as torchrun refuses a name nothing installs.
cpprun --logs_specs=mine /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 2 "--logs_specs=mine exit code"
expect_in_file "$WORK/err" "--logs_specs=mine: not a LogsSpecs entry point cpprun has; it has only torchrun's default, --logs_specs=default" \
  "--logs_specs message"
[ ! -e "$WORK/started" ] || fail "a worker ran"
cpprun --logs_specs default /bin/true
expect_eq "$?" 0 "--logs_specs default exit code"
[ ! -s "$WORK/err" ] || fail "--logs_specs default said something on stderr"
cpprun --print_completion bash
expect_eq "$?" 0 "--print_completion exit code"
expect_in_file "$WORK/out" "complete -o default -W" "completion script"
bash -n "$WORK/out" || fail "the bash completion script does not parse"
expect_no_leftovers
echo PASS
