"""Every thread's Python stack on request, for the hang report: no ptrace, no privileges.

``faulthandler`` dumps all threads from a signal handler written in C, so it answers even
while the interpreter is blocked inside a collective or a ``time.sleep``. The hook registers
it for a real-time signal (``SIGRTMIN + 5``; chained when the program already handles that
signal, so its handler still runs) writing to ``stacks.<pid>.txt`` in the run's directory (that of
``$STALLSCOPE_SOCKET``), and says where in meta ``stacks=<path> stacks_signal=<number>``:
stallscope then signals the process and reads what the dump appended. Only the training
loops are signalled; a forked child (a DataLoader worker) inherits the registration and its
parent's file, and says nothing of it. A registration that fails is said in meta
``stacks_failed=1`` and the training goes on.

A signal that comes late must not end the process: Python's finalization unregisters the
dump and puts back the disposition it found, and a real-time signal's default action
terminates. Where the program left it at the default, the hook sets it to ignored first, so
what finalization puts back ignores a request that arrives while the process exits (stallscope
asks when a job stalls, and a job's last seconds look like a stall). Processes it execs
inherit that (only that one signal) ignored.
"""

import faulthandler
import os
import signal

import stallscope

_file = None


def install(torch=None):
    """Registers the dump for this process; never raises."""
    global _file
    if not os.environ.get("STALLSCOPE_SOCKET"):
        return  # an agent's shared socket: no per-run directory to write to
    try:
        number = int(signal.SIGRTMIN) + 5
        directory = os.path.dirname(os.environ["STALLSCOPE_SOCKET"])
        path = os.path.join(directory, "stacks.%d.txt" % os.getpid())
        handle = open(path, "ab", buffering=0)
        # Chained only to a handler the program set: chaining to the default action of a
        # real-time signal would end the process after the dump.
        chain = signal.getsignal(number) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        if not chain:
            # What finalization puts back: ignored, not the default (which terminates).
            signal.signal(number, signal.SIG_IGN)
        faulthandler.register(number, file=handle, all_threads=True, chain=chain)
        _file = handle  # kept open: the handler writes to its descriptor
        stallscope.meta(stacks=path, stacks_signal=number)
    except Exception:
        stallscope.meta(stacks_failed=1)
