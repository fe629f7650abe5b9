#!/usr/bin/env python3
"""What stallscope's eBPF programs cost inside the kernel, where getrusage does not see it.

The thread-state programs run at every context switch and wake-up on the machine (in the
context of whichever thread switches: mostly the training's), so their time is charged to
those threads, not to stallscope. This runs the issue-31 job (`stallscope launch`, 2 ranks,
2 loader workers each) under `stallscope run` (with `STALLSCOPE_EBPF=on`) with `kernel.bpf_stats_enabled` = 1 (restored
afterwards), and reads each of stallscope's programs' `run_time_ns` and `run_cnt` from
`/proc/PID/fdinfo` at --start and --end seconds into the run: the kernel time as % of one
core, calls per second and ns per call, beside stallscope's own threads' CPU in the same
window. Needs root.

    sudo python3 bench/ebpf_cost.py [--stallscope target/release/stallscope] [--repeats 3]
        [--iters 480] [--start 10] [--end 40]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

from common import add_binary_args, launch_job, prepare_data

STATS = "/proc/sys/kernel/bpf_stats_enabled"


def programs(pid):
    """{prog_id: (run_time_ns, run_cnt)} of the BPF programs pid holds open."""
    out = {}
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "prog_id" in fields and "run_time_ns" in fields:
            out[int(fields["prog_id"])] = (int(fields["run_time_ns"]), int(fields["run_cnt"]))
    return out


def own_cpu_ns(pid):
    """ns on the CPU of every thread of pid, summed."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue
    return total


def one_run(args, tmp):
    train = launch_job(args.python, args.iters, 29624, args.stallscope, [])
    cmd = [args.stallscope, "run", "-q", "--rate", "100", "-o",
           os.path.join(tmp, "t.stallscope"), "--"] + train
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, STALLSCOPE_EBPF="on"))
    try:
        time.sleep(args.start)
        t0, progs0, own0 = time.monotonic(), programs(proc.pid), own_cpu_ns(proc.pid)
        time.sleep(args.end - args.start)
        t1, progs1, own1 = time.monotonic(), programs(proc.pid), own_cpu_ns(proc.pid)
    finally:
        proc.wait(timeout=600)
    wall = t1 - t0
    run_ns = sum(progs1[p][0] - progs0[p][0] for p in progs1 if p in progs0)
    calls = sum(progs1[p][1] - progs0[p][1] for p in progs1 if p in progs0)
    return {
        "programs": len(progs1),
        "kernel %": run_ns / wall / 1e9 * 100,
        "calls/s": calls / wall,
        "ns/call": run_ns / max(calls, 1),
        "stallscope threads %": (own1 - own0) / wall / 1e9 * 100,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_binary_args(ap)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=480)
    ap.add_argument("--start", type=float, default=10)
    ap.add_argument("--end", type=float, default=40)
    args = ap.parse_args()
    prepare_data(args.python)
    with open(STATS) as f:
        was = f.read().strip()
    runs = []
    try:
        with open(STATS, "w") as f:
            f.write("1")
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                runs.append(one_run(args, tmp))
                print(f"# run {i + 1}: {runs[-1]}", flush=True)
    finally:
        with open(STATS, "w") as f:
            f.write(was)
    print("| figure | min | median | max |")
    print("|---|---|---|---|")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"| {key} | {min(values):.3f} | {statistics.median(values):.3f} | {max(values):.3f} |")


if __name__ == "__main__":
    main()
