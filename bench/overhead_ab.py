#!/usr/bin/env python3
"""Two builds of stallscope against each other: their own CPU on the same job, alternated.

The job is the example DDP training with 2 ranks and 2 DataLoader workers per rank, as in
bench/overhead.py. Runs alternate (A, B, plain, A, B, plain, ...) so that the machine's slow
and fast spells hit both builds alike; each build's CPU is its own getrusage over the run
(`profiler_cpu_seconds` of the summary), as a share of one core over the run's wall time.
Prints min / median / max per build, and the median iteration of each against the plain runs.

    python3 bench/overhead_ab.py --a OLD/stallscope --b NEW/stallscope [--repeats 7] [--iters 60]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

from common import overhead_job, prepare_data

TIME_RE = re.compile(r"^iter (\d+) .*time_ms ([0-9.]+)", re.M)


def spread(xs, fmt="{:.2f}"):
    return " / ".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first build (the baseline)")
    ap.add_argument("--b", required=True, help="the second build")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    train = overhead_job(args.python, args.iters, 29613)
    prepare_data(args.python)
    builds = [("A", args.a), ("B", args.b), ("plain", None)]
    cpu = {name: [] for name, _ in builds}
    iters = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, exe in builds:
                js = os.path.join(tmp, f"{name}{rep}.json")
                cmd = train if exe is None else [
                    exe, "run", "-q", "-o", os.path.join(tmp, f"{name}{rep}.stallscope"),
                    "--summary-json", js, "--"] + train
                t0 = time.monotonic()
                out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                wall = time.monotonic() - t0
                times = [float(ms) / 1000 for it, ms in TIME_RE.findall(out.stdout)
                         if int(it) >= args.warmup]
                iters[name].append(statistics.median(times))
                if exe is not None:
                    with open(js) as f:
                        cpu[name].append(100 * json.load(f)["profiler_cpu_seconds"] / wall)
    base = statistics.median(iters["plain"])
    print(f"{args.repeats} alternated runs of {args.iters} iterations each; "
          f"A = {args.a}, B = {args.b}\n")
    print("| build | stallscope CPU, % of one core: min / median / max | median iteration (s): "
          "min / median / max | ratio to plain (medians) |")
    print("|---|---|---|---|")
    for name, exe in builds:
        c = spread(cpu[name]) if cpu[name] else "—"
        it = statistics.median(iters[name])
        print(f"| {name} | {c} | {spread(iters[name], '{:.4f}')} | {it / base:.3f} |")


if __name__ == "__main__":
    main()
