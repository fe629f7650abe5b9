"""Idle connections against `/metrics` (issue 30, item 2): opens N connections to the port,
each sending half a request head, holds them HOLD seconds, and says how many the server closed.
Before the fix none was closed (no header timer), the accept loop spun on EMFILE, and the run's
/proc discovery failed with "Too many open files".

usage: stallscope run --metrics 127.0.0.1:PORT -- sleep 45 &
       python3 bench/hostile/metrics_flood.py PORT 300 15
"""
import socket
import sys
import time

port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks = []
for _ in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    except OSError as e:
        print("connect failed:", e)
        break
time.sleep(hold)
closed = 0
for s in socks:
    s.settimeout(0.01)
    try:
        if s.recv(1) == b"":
            closed += 1
    except socket.timeout:
        pass
    except OSError:
        closed += 1
print(f"opened {len(socks)}, closed by the server after {hold} s: {closed}")
