#!/usr/bin/env python3
"""Counts two-rank gloo jobs that hang when they destroy their process group right after the
last backward (see profiler/python/stallscope/_comm_release.py for why).

Each job is two ranks on loopback of a small DDP model: three backward passes, then
``destroy_process_group()`` and ``del model``. A rank still running after ``--timeout`` s is
counted as hung and killed. Modes:

* ``stallscope``: each rank under ``stallscope run`` (the zero-code hook relays DDP's comm);
* ``hook``: the zero-code hook without the binary (``PYTHONPATH`` and ``STALLSCOPE_SOCKET`` as
  ``stallscope run`` sets them, the markers drained by this script), so that thousands of
  ranks take minutes, ``--parallel`` jobs at once (the test suite starts two);
* ``python-hook``: no stallscope, the program registers ``default_hooks.allreduce_hook``
  itself (PyTorch's own race);
* ``plain``: no stallscope, no hook (DDP's built-in C++ all-reduce).

    python3 bench/exit_race.py --mode stallscope --jobs 40
    python3 bench/exit_race.py --mode hook --jobs 500 --parallel 2 --stacks

With ``--stacks`` each hung rank's native stacks (gdb) are printed before it is killed.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "profiler", "python", "tests"))

from procs import native_stacks, store_port  # noqa: E402  (the tests' helpers)

JOB = """
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    dist.init_process_group("gloo")
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    if sys.argv[1] == "python-hook":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
    dist.destroy_process_group()
    del model, net
"""


def drain(path):
    """Binds a datagram socket at ``path`` and reads what arrives, on a daemon thread (the
    markers of ``--mode hook``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)

    def run():
        while True:
            try:
                sock.recv(65536)
            except OSError:
                return

    threading.Thread(target=run, daemon=True).start()


def start_job(args, script, work, job):
    """Starts the two ranks of one job."""
    port = str(store_port())
    procs = []
    for rank in (0, 1):
        cmd = [args.python, script, args.mode]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        if args.mode == "stallscope":
            profile = os.path.join(work, "job%d-rank%d.stallscope" % (job, rank))
            cmd = [args.stallscope, "run", "-q", "-o", profile, "--"] + cmd
        elif args.mode == "hook":
            env.pop("STALLSCOPE_AUTO", None)
            env.update(PYTHONPATH=os.path.join(REPO, "profiler", "python"),
                       STALLSCOPE_SOCKET=os.path.join(work, "markers.sock"))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    return procs


def run_jobs(args, script, work, first):
    """Runs ``--parallel`` jobs at once; returns how many ranks were still running after
    the timeout."""
    procs = [p for j in range(args.parallel) for p in start_job(args, script, work, first + j)]
    hung = 0
    for proc in procs:
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            hung += 1
            if args.stacks:
                print("-- rank %d hung:\n%s" % (proc.pid, native_stacks(proc.pid)),
                      flush=True)
    if hung:
        kill_running(script)  # `stallscope run` gives its training a process group of its own
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return hung


def kill_running(script):
    """Kills every process running ``script`` (its path is unique to this benchmark run)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if script.encode() in f.read():
                    os.kill(int(pid), 9)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["stallscope", "hook", "python-hook", "plain"],
                    default="stallscope")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=1, help="jobs at once")
    ap.add_argument("--stacks", action="store_true", help="print a hung rank's stacks (gdb)")
    ap.add_argument("--timeout", type=float, default=30.0, help="s a rank may take")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/debug/stallscope"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stallscope-exit-race-") as work:
        script = os.path.join(work, "job.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(JOB))
        drain(os.path.join(work, "markers.sock"))
        batches = range(0, args.jobs, args.parallel)
        hung = sum(run_jobs(args, script, work, first) for first in batches)
    ranks = 2 * args.parallel * len(batches)
    print("%s: %d of %d ranks hung (load average at the end %.2f)"
          % (args.mode, hung, ranks, os.getloadavg()[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
