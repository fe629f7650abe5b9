#!/usr/bin/env python3
"""Where `stallscope run`'s own CPU goes, thread by thread, once the training is running.

Runs the example DDP training (2 ranks, 2 DataLoader workers each) under `stallscope run` at
100 Hz and reads `/proc/PID/task/*/schedstat` of stallscope's threads at --start and --end
seconds into the run: CPU as % of one core, and the CPU per wake-up (a thread's run count
in schedstat). The startup of the training (imports, spawning) is left out, unlike
bench/overhead.py, which averages over the whole run. With --launch, the issue-31 job
(`stallscope launch --nproc-per-node 2`, the ranks' launcher being stallscope's own).

    python3 bench/overhead_threads.py [--stallscope target/release/stallscope] [--repeats 3]
        [--launch] [--iters 150] [--start 6] [--end 20]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import add_binary_args, launch_job, overhead_job, prepare_data


def threads(pid):
    """{thread name: (ns on CPU, times run)} of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns, _, runs = (int(x) for x in f.read().split())
        except OSError:
            continue
        out[name] = (ns, runs)
    return out


def one_run(args, tmp):
    train = (launch_job(args.python, args.iters, 29622, args.stallscope, []) if args.launch
             else overhead_job(args.python, args.iters, 29622))
    cmd = [args.stallscope, "run", "-q", "--rate", "100", "-o",
           os.path.join(tmp, "t.stallscope"), "--"] + train
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(args.start)
        t0, before = time.monotonic(), threads(proc.pid)
        time.sleep(args.end - args.start)
        t1, after = time.monotonic(), threads(proc.pid)
    finally:
        proc.wait(timeout=600)
    wall_ns = (t1 - t0) * 1e9
    return {name: ((after[name][0] - ns) / wall_ns * 100,
                   (after[name][0] - ns) / max(after[name][1] - runs, 1) / 1e3)
            for name, (ns, runs) in before.items() if name in after}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_binary_args(ap)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start", type=float, default=6.0)
    ap.add_argument("--end", type=float, default=20.0)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--launch", action="store_true",
                    help="the issue-31 job: ranks started by `stallscope launch`")
    args = ap.parse_args()
    prepare_data(args.python)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            runs.append(one_run(args, tmp))
            print(f"# run {rep + 1} done", file=sys.stderr)
    names = sorted({n for r in runs for n in r}, key=lambda n: -statistics.median(
        r[n][0] for r in runs if n in r))
    print("| thread | CPU (% of one core) | CPU per wake-up (µs) |")
    print("|---|---|---|")
    total = 0.0
    for n in names:
        cpu = statistics.median(r[n][0] for r in runs if n in r)
        per = statistics.median(r[n][1] for r in runs if n in r)
        total += cpu
        if cpu >= 0.005:
            print(f"| {n} | {cpu:.2f} | {per:.1f} |")
    print(f"| all | {total:.2f} | |")
    print(f"\nmedian of {args.repeats} runs, {args.start:.0f}–{args.end:.0f} s into a {args.iters}-iteration "
          f"run at 100 Hz")


if __name__ == "__main__":
    main()
