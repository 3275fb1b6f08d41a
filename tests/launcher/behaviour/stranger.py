#!/usr/bin/env python3
"""A stranger on the network talking to a cpprun agent's port, as the attacks in issue 16 did.

    stranger.py hello HOST PORT       says hello as node 1 would, in the clear (old protocol: no proof)
    stranger.py proof HOST PORT       answers the challenge with a made-up proof
    stranger.py flood HOST PORT       sends 1 MiB without a newline
    stranger.py hold HOST PORT N      opens N connections and keeps them open, silent, until killed

Prints everything the agent sent back (until it closed the connection, or 5 s passed) on stdout,
so the test can check that the agent revealed nothing but its challenge and its refusal.
"""
import os
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


def main():
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
