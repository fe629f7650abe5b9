#!/usr/bin/env python3
"""A fast training loop without training: ranks that mark ~7 events per iteration (data,
compute and comm phases and the step) every few milliseconds, for measuring what a profile
costs per hour at 1–10 ms iterations (issue 31), where the example's model cannot go.

    stallscope run -o P.stallscope -- python3 bench/fast_loop.py --ranks 2 --iter-ms 2 --seconds 40

Each rank is a process of its own (RANK and WORLD_SIZE set before `import stallscope`); an
iteration waits for data (sleeps 20% of it), computes (spins 60%) and communicates (sleeps 20%).
"""
import argparse
import os
import sys
import time


def rank_loop(iter_s, seconds):
    import stallscope
    stallscope.meta(workers=0)
    spin_s, wait_s = 0.6 * iter_s, 0.2 * iter_s
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with stallscope.phase("data"):
            time.sleep(wait_s)
        with stallscope.phase("compute"):
            until = time.perf_counter() + spin_s
            while time.perf_counter() < until:
                pass
        with stallscope.phase("comm"):
            time.sleep(wait_s)
        stallscope.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iter-ms", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    args = ap.parse_args()
    pids = []
    for rank in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            os.environ["RANK"] = str(rank)
            os.environ["WORLD_SIZE"] = str(args.ranks)
            rank_loop(args.iter_ms / 1000, args.seconds)
            os._exit(0)
        pids.append(pid)
    status = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        status = status or os.waitstatus_to_exitcode(st)
    sys.exit(status)


if __name__ == "__main__":
    main()
