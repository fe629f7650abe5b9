"""Helpers for tests and benchmarks that start torch.distributed jobs of their own: a store
port no other job takes, and a hung process's native stacks."""

import random
import socket
import subprocess

# Ports handed out as stores' by this process: never twice.
_ports_given = set()


def store_port():
    """A free port for a job's store (``MASTER_PORT``), below the kernel's ephemeral range.

    A port from ``bind(0)`` comes from that range, and stays free only until the store binds
    it, a second later: meanwhile any process's outgoing connection or ``bind(0)`` (gloo's
    listeners, another job's store port chosen the same way) could take it. Then a rank 0
    failed to bind its store, or a rank waited for ever in gloo's rendezvous (1 process in
    about 520, when two jobs start at once). No port below the range is handed out by the
    kernel.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = max(1024, low - 8192)
    for _ in range(1000 if low - first >= 1024 else 0):
        port = random.randrange(first, low)
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def native_stacks(pid):
    """Every thread's native stack of process ``pid`` (gdb's backtraces): where a hung rank
    waits (gloo's rendezvous, a thread join at destroy, the GIL)."""
    try:
        out = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
            capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return "no stacks (%s)" % e
    return "\n".join(line for line in out.splitlines() if line.startswith(("Thread ", "#")))
