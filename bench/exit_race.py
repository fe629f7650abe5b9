#!/usr/bin/env python3
"""Counts two-rank gloo jobs that hang when they destroy their process group right after the
last backward (see profiler/python/stallscope/_comm_release.py for why).

Each job is two ranks on loopback of a small DDP model: three backward passes, then
``destroy_process_group()`` and ``del model``. A rank still running after ``--timeout`` s is
counted as hung and killed. Modes:

* ``stallscope``: each rank under ``stallscope run`` (the zero-code hook relays DDP's comm);
* ``python-hook``: no stallscope, the program registers ``default_hooks.allreduce_hook``
  itself (PyTorch's own race);
* ``plain``: no stallscope, no hook (DDP's built-in C++ all-reduce).

    python3 bench/exit_race.py --mode stallscope --jobs 40
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(args, script, work):
    """Starts the two ranks; returns how many were still running after the timeout."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        cmd = [args.python, script, args.mode]
        if args.mode == "stallscope":
            profile = os.path.join(work, "rank%d.stallscope" % rank)
            cmd = [args.stallscope, "run", "-q", "-o", profile, "--"] + cmd
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    hung = 0
    for proc in procs:
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            hung += 1
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
    ap.add_argument("--mode", choices=["stallscope", "python-hook", "plain"], default="stallscope")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=30.0, help="s a rank may take")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/debug/stallscope"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stallscope-exit-race-") as work:
        script = os.path.join(work, "job.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(JOB))
        hung = sum(run_job(args, script, work) for _ in range(args.jobs))
    print("%s: %d of %d ranks hung (load average at the end %.2f)"
          % (args.mode, hung, 2 * args.jobs, os.getloadavg()[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
