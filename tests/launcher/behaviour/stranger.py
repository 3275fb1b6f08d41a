#!/usr/bin/env python3
"""A stranger on the network talking to a cpprun agent's port, as the attacks in issue 16 did.

    stranger.py hello HOST PORT       says hello as node 1 would, in the clear (old protocol: no proof)
    stranger.py proof HOST PORT       answers the challenge with a made-up proof
    stranger.py flood HOST PORT       sends 1 MiB without a newline
    stranger.py hold HOST PORT N      opens N connections and keeps them open, silent, until killed
    stranger.py storm HOST PORT SECONDS [SOURCE]
                                      opens connections as fast as it can for SECONDS (from the local
                                      address SOURCE if given), each held silent for 1 s; prints
                                      "storming" at the start, "full" once it lets the first go
    stranger.py partial HOST PORT SECONDS
                                      reads the challenge, sends half a proof line and falls silent;
                                      prints "closed after T s" when the agent closes the connection,
                                      or "still open after SECONDS s"
    stranger.py squat HOST PORT close|http|silent
                                      is no agent but listens at the port: every connection is closed
                                      at once without a word (close) or after an HTTP answer (http),
                                      or kept open and never answered (silent);
                                      prints "listening", and "accepted N connections" when ended by
                                      SIGTERM

Prints everything the agent sent back (until it closed the connection, or 5 s passed) on stdout,
so the test can check that the agent revealed nothing but its challenge and its refusal.
"""
import collections
import os
import resource
import signal
import socket
import sys
import time


def read_all(sock, seconds=5.0):
    sock.settimeout(seconds)
    data = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def storm(host, port, seconds, source):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held = collections.deque()
    opened = 0
    end = time.monotonic() + seconds
    print("storming", flush=True)
    full = False
    while time.monotonic() < end:
        now = time.monotonic()
        while held and now - held[0][0] > 1.0:
            held.popleft()[1].close()
            if not full:
                print(f"full: holding {len(held) + 1} connections", flush=True)
                full = True
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # out of descriptors: let the held ones go first
            time.sleep(0.001)
            continue
        try:
            if source:
                sock.bind((source, 0))
            sock.setblocking(False)
            sock.connect_ex((host, port))
            held.append((now, sock))
            opened += 1
        except OSError:
            sock.close()
    print(f"opened {opened} connections in {seconds:.0f} s", flush=True)


def partial(host, port, seconds):
    sock = socket.create_connection((host, port), timeout=5)
    sock.recv(4096)  # the challenge
    sock.sendall(b"cpprun-proof 01234")  # no newline: the line never ends
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        print(f"closed after {time.monotonic() - started:.1f} s", flush=True)
    except socket.timeout:
        print(f"still open after {seconds:.0f} s", flush=True)
    except ConnectionResetError:
        print(f"closed after {time.monotonic() - started:.1f} s", flush=True)


def squat(host, port, mode):
    accepted = 0

    def report(*_):
        print(f"accepted {accepted} connections", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(128)
    print("listening", flush=True)
    held = []
    while True:
        peer, _ = server.accept()
        accepted += 1
        if mode == "silent":
            held.append(peer)
            continue
        if mode == "http":
            try:
                peer.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            except OSError:
                pass
        peer.close()


def main():
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "partial":
        partial(host, port, float(sys.argv[4]))
        return
    if mode == "squat":
        squat(host, port, sys.argv[4])
        return
    if mode == "storm":
        storm(host, port, float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
        return
    if mode == "hold":
        held = [socket.create_connection((host, port)) for _ in range(int(sys.argv[4]))]
        print(f"holding {len(held)} connections", flush=True)
        time.sleep(3600)
        return
    sock = socket.create_connection((host, port), timeout=5)
    if mode == "hello":
        # node_rank 1 of 2, max_restarts 0, run id "none": the defaults a stranger would guess.
        sock.sendall(b"hello 3 static 1 2 2 1 0 none default\nfailed 0 0 0 pwned\x1b[2J\n")
    elif mode == "proof":
        challenge = sock.recv(4096).decode()
        print(challenge, end="")
        sock.sendall(b"cpprun-proof " + os.urandom(16).hex().encode() + b" " + b"0" * 64 + b"\n")
    elif mode == "flood":
        try:
            sock.sendall(b"x" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
    print(read_all(sock), end="")


if __name__ == "__main__":
    main()
