#!/usr/bin/env python3
"""Holds N requests in flight for bench/concurrency.sh: one connection per request, key c<i>,
each read to its end. Usage: hold_clients.py host port n timeout_seconds. Exits 1 unless every
response was a 200 read to the end within the timeout."""
import selectors
import socket
import sys
import time


def main():
    host, port, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sel = selectors.DefaultSelector()
    got = {}
    for i in range(n):
        s = socket.create_connection((host, port))
        s.sendall(f"GET /h?k=c{i} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        s.setblocking(False)
        got[s] = bytearray()
        sel.register(s, selectors.EVENT_READ)
    deadline, done = time.time() + limit, 0
    while done < n and time.time() < deadline:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            chunk = s.recv(65536)
            if chunk:
                got[s] += chunk
                continue
            sel.unregister(s)
            s.close()
            done += 1
    ok = sum(1 for b in got.values() if b.startswith(b"HTTP/1.1 200"))
    print(f"{ok} of {n} answered 200, {done} read to the end")
    if ok < n:
        print(next(bytes(b[:200]) for b in got.values() if not b.startswith(b"HTTP/1.1 200")))
    sys.exit(0 if ok == n and done == n else 1)


main()
