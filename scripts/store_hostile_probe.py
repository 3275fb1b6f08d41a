#!/usr/bin/env python3
"""How LibTorch's c10d TCPStore server (the one every cpprun/torchrun job's rank 0 or agent runs)
behaves against a peer that speaks its wire protocol badly on purpose. Prints figures; asserts
nothing. Binds 127.0.0.1 only.

usage: .venv/bin/python scripts/store_hostile_probe.py [--backend libuv|legacy|both] [--idle N]

Each probe starts a fresh server in a child process (so its RSS is the server's alone) and reports
the server's RSS before and after, and whether a well-behaved client (torch.distributed.TCPStore)
can still connect, set and get a key, and how long that took (its child process, which also
imports torch, is killed when no answer comes within a minute):
  huge_length   'set' whose value length prefix claims 4 GiB, followed by a few bytes
  huge_key      'set' whose key length prefix claims 4 GiB
  big_values    legitimate 'set's of values as large as the server accepts, under many keys
  half_sent     a 'set' cut off half-way, then silence (connection kept open)
  idle          N connections that connect and say nothing

Wire format (torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp and TCPStoreBackend.hpp,
LibTorch 2.15): a client first sends VALIDATE (command byte 0, then the uint32 magic 0x3C85F7CE);
a 'set' is command byte 1, uint64 key length, key bytes, uint64 value length, value bytes; all
little-endian on x86.
"""
import argparse
import multiprocessing as mp
import os
import socket
import struct
import time
from datetime import timedelta

VALIDATE, SET = 0, 1
MAGIC = 0x3C85F7CE
CLIENT_LIMIT_S = 60


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def serve(port_queue, use_libuv):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), use_libuv=use_libuv)
    port_queue.put(store.port)
    time.sleep(3600)


def start_server(use_libuv):
    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=serve, args=(queue, use_libuv), daemon=True)
    proc.start()
    return proc, queue.get(timeout=60)


def raw_connection(port, validate=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if validate:
        s.sendall(struct.pack("<BI", VALIDATE, MAGIC))
    return s


def _client(port, use_libuv, timeout_s, result):
    import torch.distributed as dist

    result.put("started")
    start = time.monotonic()
    try:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=timeout_s), use_libuv=use_libuv)
        client.set("probe", b"x" * 100)
        result.put((client.get("probe") == b"x" * 100, time.monotonic() - start, ""))
    except Exception as e:  # noqa: BLE001 - reported, not handled
        result.put((False, time.monotonic() - start, str(e).splitlines()[0][:160]))


def well_behaved_client(port, use_libuv, timeout_s=5.0, limit_s=CLIENT_LIMIT_S):
    """(ok, seconds, error) for one connect+set+get by torch's own client, in a child process
    that is killed after limit_s (the client's own timeout does not bound every wait)."""
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    proc = ctx.Process(target=_client, args=(port, use_libuv, timeout_s, result), daemon=True)
    proc.start()
    result.get(timeout=120)  # the child has imported torch
    start = time.monotonic()
    try:
        ok, seconds, err = result.get(timeout=limit_s)
    except Exception:  # noqa: BLE001 - queue.Empty: no answer at all
        ok, seconds, err = False, time.monotonic() - start, f"no answer within {limit_s} s (killed)"
    proc.kill()
    proc.join()
    return ok, seconds, err


def closed_by_server(sock, wait_s=2.0):
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def probe(name, use_libuv, action):
    proc, port = start_server(use_libuv)
    time.sleep(0.5)
    before = rss_mib(proc.pid)
    ok0, t0, _ = well_behaved_client(port, use_libuv)
    detail = action(port)
    peak = before
    for _ in range(10):  # RSS over 5 s: an allocation may still be being filled
        time.sleep(0.5)
        peak = max(peak, rss_mib(proc.pid))
    ok, t, err = well_behaved_client(port, use_libuv)
    after = rss_mib(proc.pid)
    alive = proc.is_alive()
    print(f"{'libuv' if use_libuv else 'legacy':6} {name:12} server RSS {before:6.0f} -> peak {peak:6.0f}"
          f" -> {after:6.0f} MiB | {detail} | well-behaved client before: {'ok' if ok0 else 'FAILED'}"
          f" {t0:.1f} s, after: {'ok' if ok else 'FAILED'} {t:.1f} s {err} | server alive: {alive}",
          flush=True)
    proc.kill()
    proc.join()


def huge_length(port):
    s = raw_connection(port)
    s.sendall(struct.pack("<BQ", SET, 3) + b"key" + struct.pack("<Q", 4 << 30) + b"abcdefgh")
    return f"connection closed by server: {closed_by_server(s)}"


def huge_key(port):
    s = raw_connection(port)
    s.sendall(struct.pack("<BQ", SET, 4 << 30) + b"abcdefgh")
    return f"connection closed by server: {closed_by_server(s)}"


def big_values(port, count=32, size=8 * 1024 * 1024 - 64):
    s = raw_connection(port)
    value = b"v" * size
    for i in range(count):
        key = f"big/{i}".encode()
        s.sendall(struct.pack("<BQ", SET, len(key)) + key + struct.pack("<Q", len(value)) + value)
    return f"{count} x {size / 2**20:.1f} MiB values set; closed by server: {closed_by_server(s, 1.0)}"


_held = []  # connections a probe leaves open until the server is killed


def half_sent(port):
    s = raw_connection(port)
    s.sendall(struct.pack("<BQ", SET, 3) + b"key" + struct.pack("<Q", 1000) + b"only ten b")
    _held.append(s)
    return "1000-byte set cut off after 10 bytes, connection left open"


def idle(port, count):
    opened = 0
    try:
        for _ in range(count):
            _held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            opened += 1
    except OSError as e:
        return f"{opened} idle connections, then {e}"
    return f"{opened} idle connections open"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["libuv", "legacy", "both"], default="both")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections to open (default 1000)")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}; server in a child process on 127.0.0.1; client timeout 5 s")
    backends = {"libuv": [True], "legacy": [False], "both": [True, False]}[args.backend]
    for use_libuv in backends:
        probe("huge_length", use_libuv, huge_length)
        probe("huge_key", use_libuv, huge_key)
        probe("big_values", use_libuv, big_values)
        probe("half_sent", use_libuv, half_sent)
        for s in _held:
            s.close()
        _held.clear()
        probe("idle", use_libuv, lambda port: idle(port, args.idle))
        for s in _held:
            s.close()
        _held.clear()


if __name__ == "__main__":
    main()
