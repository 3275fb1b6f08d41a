# Two Chrome traces (train_gpt --trace, bench/gpt_twin.py --trace: the same 3 steps of the same
# model) side by side, kernel by kernel: where one spends device time the other does not.
#   python3 bench/trace_kernels.py CPPRUN_TRACE PYTORCH_TRACE [--top N]
# Per trace: the device time of all kernels and memory copies/sets (the sum of their durations),
# the span from the first to the last (the steps' wall time on the device), and how much of the
# span the device was idle. Then the N kernel names (default 25) whose total time differs most,
# each with its count and total time in both. Without device events (a CPU run) the host operators
# (cat cpu_op) are compared instead, by the time inside each (self time is not in the trace).
import argparse, collections, json, sys

p = argparse.ArgumentParser()
p.add_argument("cpprun")
p.add_argument("pytorch")
p.add_argument("--top", type=int, default=25)
a = p.parse_args()


def load(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_kernels: cannot read {path}: {e}")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def device_events(events):
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def summary(events):
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        entry = by_name[e["name"]]
        entry[0] += 1
        entry[1] += float(e["dur"])
    busy = sum(float(e["dur"]) for e in events)
    span = (max(float(e["ts"]) + float(e["dur"]) for e in events) - min(float(e["ts"]) for e in events)) if events else 0.0
    return by_name, busy, span


sides = {"cpprun": load(a.cpprun), "pytorch": load(a.pytorch)}
on_device = all(device_events(ev) for ev in sides.values())
what = "kernels, copies and sets on the device" if on_device else "host operators (no device events)"
stats = {}
for side, events in sides.items():
    chosen = device_events(events) if on_device else [e for e in events if e.get("cat") == "cpu_op"]
    stats[side] = summary(chosen)
print(f"trace_kernels: {what}, times in ms over the traced steps")
for side, (by_name, busy, span) in stats.items():
    # (durations and timestamps are in microseconds)
    idle = f", idle {(span - busy) / 1e3:.3f} ms ({100 * (span - busy) / span:.1f}% of the span)" if on_device and span else ""
    print(f"  {side:8s} {sum(c for c, _ in by_name.values()):6d} events, {busy / 1e3:10.3f} ms busy, span {span / 1e3:10.3f} ms{idle}")
c_names, p_names = stats["cpprun"][0], stats["pytorch"][0]
names = set(c_names) | set(p_names)
rows = sorted(names, key=lambda n: -abs(c_names.get(n, [0, 0.0])[1] - p_names.get(n, [0, 0.0])[1]))
print(f"\n{'cpprun ms':>10s} {'n':>5s} {'pytorch ms':>10s} {'n':>5s} {'diff ms':>9s}  name (the {a.top} largest differences)")
for n in rows[:a.top]:
    cn, ct = c_names.get(n, [0, 0.0])
    pn, pt = p_names.get(n, [0, 0.0])
    print(f"{ct / 1e3:10.3f} {cn:5d} {pt / 1e3:10.3f} {pn:5d} {(ct - pt) / 1e3:+9.3f}  {n[:110]}")
