"""A worker that speaks the flight-recorder protocol as cpprun's library does (the launcher's side is
what diagnosis.sh tests; the library's own is tested under tests/dist): it announces itself with
rank_R.listening in $CPPRUN_FLIGHT_RECORDER_DIR, dumps rank_R.json at each byte on fd
$CPPRUN_FLIGHT_RECORDER_REQUEST_FD, and plays one part of a hang:
  behind   stuck in all_reduce #5 until stopped
  ahead    finished #5, waits in all_gather #6 until stopped
  garbled  answers each request with a damaged dump, until stopped
  fails    like ahead, then dumps #6 as failed and exits 3 once the file $FAIL_ON is there (the
           test's go, given once the others are ready), writing the Unix time in ms (where a
           test's time bound starts) to $FAULT_MARK first if it is set
usage: fake_recorder.py PART"""
import json, os, sys, threading, time

part = sys.argv[1]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
directory = os.environ["CPPRUN_FLIGHT_RECORDER_DIR"]
request_fd = int(os.environ["CPPRUN_FLIGHT_RECORDER_REQUEST_FD"])
start = int(time.time() * 1000) - 60000  # as if the job had run a minute

def entry(seq, op, state, shape, reduce_op):
    return {"group": "world", "group_ranks": [], "seq": seq, "op": op, "dtype": "float32", "shapes": [shape],
            "reduce_op": reduce_op, "root": None, "state": state, "start_unix_ms": start + seq * 1000,
            "end_unix_ms": start + seq * 1000 + 5 if state == "completed" else None}

def entries(failed=False):
    history = [entry(s, "all_reduce", "completed", [4096], "sum") for s in range(1, 5)]
    if part == "behind":
        return history + [entry(5, "all_reduce", "started", [4096], "sum")]
    return history + [entry(5, "all_reduce", "completed", [4096], "sum"),
                      entry(6, "all_gather", "failed" if failed else "started", [1024], None)]

def dump(reason, failed=False):
    doc = {"format": "cpprun-flight-recorder", "version": 1, "rank": rank, "world_size": world, "pid": os.getpid(),
           "dumped_unix_ms": int(time.time() * 1000), "reason": reason, "entries": entries(failed)}
    path = os.path.join(directory, f"rank_{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.rename(path + ".tmp", path)

def listen():
    while os.read(request_fd, 1):
        if part == "garbled":
            path = os.path.join(directory, f"rank_{rank}.json")
            with open(path + ".tmp", "w") as f:
                f.write('{"format": "cpprun-flight-recorder", "entries": [')
            os.rename(path + ".tmp", path)
        else:
            dump("request")

os.makedirs(directory, exist_ok=True)
open(os.path.join(directory, f"rank_{rank}.listening"), "w").close()
threading.Thread(target=listen, daemon=True).start()
print(f"rank {rank} playing {part}", flush=True)
if part == "fails":
    go = os.environ["FAIL_ON"]
    deadline = time.time() + 60
    while not os.path.exists(go):
        if time.time() > deadline:
            sys.exit(f"fake_recorder.py: rank {rank}: no {go} after 60 s")
        time.sleep(0.02)
    dump("failure", failed=True)
    if "FAULT_MARK" in os.environ:
        with open(os.environ["FAULT_MARK"] + ".part", "w") as f:
            f.write(f"{int(time.time() * 1000)}\n")
        os.rename(os.environ["FAULT_MARK"] + ".part", os.environ["FAULT_MARK"])
    sys.exit(3)
time.sleep(120)
