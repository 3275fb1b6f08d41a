"""How soon a workers' store keeper serves, and what it holds: a listening socket on 127.0.0.1 is
handed to the keeper as cpprun hands it (launcher/workers/store_keeper.h: the socket at a descriptor,
its standard input a pipe whose end closing stops it), then a torch.distributed.TCPStore client
connects and does one `set` and one `get`. Prints, over REPEATS keepers, the seconds from starting
the keeper to that `get`'s answer, and the keeper's resident memory (VmRSS) once it answered.
KEEPER is the path of cpprun-store-keeper, or `python`: this interpreter runs the keeper
cpprun runs under CPPRUN_STORE_KEEPER=python (its code is read from
launcher/workers/store_keeper_plan.cpp, so the two cannot differ).
  usage: .venv/bin/python scripts/bench_store_keeper.py KEEPER [REPEATS]   (default 5)"""
import datetime
import os
import re
import socket
import statistics
import subprocess
import sys
import time

from torch.distributed import TCPStore

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__)
keeper = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) == 3 else 5
plan = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launcher", "workers", "store_keeper_plan.cpp")
with open(plan) as f:
    literal = re.search(r'kPythonKeeper =\n((?:\s*".*"\n?)+);', f.read()).group(1)
python_keeper = "".join(line.encode().decode("unicode_escape") for line in re.findall(r'"(.*)"', literal))

ready, resident = [], []
for _ in range(repeats):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(socket.SOMAXCONN)
    port, fd = listener.getsockname()[1], listener.fileno()
    stdin_read, stdin_write = os.pipe()
    if keeper == "python":
        command = [sys.executable, "-c", python_keeper, str(fd), "127.0.0.1", str(port)]
    else:
        command = [keeper, f"--listen-fd={fd}", "--host=127.0.0.1", f"--port={port}"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdin=stdin_read, pass_fds=(fd,))
    listener.close()
    os.close(stdin_read)
    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
    client.set("bench", "1")
    client.get("bench")
    ready.append(time.perf_counter() - started)
    with open(f"/proc/{process.pid}/status") as status:
        resident.append(int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024)
    os.close(stdin_write)  # the keeper's standard input ends: it exits
    process.wait(timeout=30)
print(f"{keeper}: serving after {' '.join(f'{t:.3f}' for t in ready)} s, median {statistics.median(ready):.3f} s; "
      f"resident {statistics.median(resident):.0f} MB (median of {repeats}); load average "
      f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
