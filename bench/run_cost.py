#!/usr/bin/env python3
"""What watching costs: stallscope's own CPU and its profile's size per hour, build against build.

The job (issue 31): the example DDP training, 2 ranks with 2 DataLoader workers each, launched
with `stallscope launch` under `stallscope run`, ~100 ms iterations for about 40 s; or, with
`--fast-loop MS`, bench/fast_loop.py (2 ranks of MS-ms iterations, markers only). Each build
(and each flag set: `NAME=BINARY[,FLAG...]`) runs in turn, alternated `--repeats` times, so the
machine's slow and fast spells hit them alike. For each run:

- CPU: `profiler_cpu_seconds` of the summary (the `run` process's own getrusage: all its
  threads, none of the training's) over the run's wall time, as a share of one core. CPU
  seconds are what the profiler takes; on a loaded machine they hold better than wall ratios.
- size: the profile's bytes over the run's wall time (`wall_seconds` of the summary), as MB
  (10^6 bytes) per hour of run.

Prints min / median / max per configuration.

    python3 bench/run_cost.py base=/tmp/old/stallscope new=target/release/stallscope \
        all=target/release/stallscope,--keep-all-samples [--repeats 5] [--iters 300]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import DATA, EXAMPLE, prepare_data

FAST_LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_loop.py")


def spread(xs, fmt="{:.2f}"):
    return " / ".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def one_run(exe, flags, python, iters, port, profile, summary, example_args, fast_loop=None):
    if fast_loop:
        job = [python, FAST_LOOP, "--ranks", "2", "--iter-ms", str(fast_loop[0]),
               "--seconds", str(fast_loop[1])]
    else:
        job = [exe, "launch", "--nproc-per-node", "2", "--master-port", str(port), "--",
               python, EXAMPLE, "--workers", "2", "--iters", str(iters), "--data-dir", DATA
               ] + example_args
    cmd = [exe, "run", "-q", "-o", profile, "--summary-json", summary] + flags + ["--"] + job
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.monotonic() - t0
    with open(summary) as f:
        s = json.load(f)
    size = os.path.getsize(profile)
    return {
        "wall": wall,
        "cpu_pct": 100 * s["profiler_cpu_seconds"] / wall,
        "mb_per_hour": size / 1e6 / s["wall_seconds"] * 3600,
        "bytes": size,
        "iterations": sum(r.get("iterations", 0) for r in s.get("ranks", [])),
        "median_iteration": statistics.median(
            r["median_iteration_seconds"] for r in s.get("ranks", []))
        if s.get("ranks") else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="NAME=BINARY[,FLAG...]")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", help="keep the profiles and summaries in this directory")
    ap.add_argument("--example-args", default="",
                    help="more flags for the example, e.g. '--width 4 --image-size 16' for "
                         "~100 ms iterations on a loaded machine")
    ap.add_argument("--fast-loop", type=float, metavar="MS",
                    help="run bench/fast_loop.py (2 ranks marking ~7 events per iteration of "
                         "MS ms, no training) instead of the example")
    ap.add_argument("--seconds", type=float, default=40.0,
                    help="how long the fast loop runs")
    args = ap.parse_args()
    configs = []
    for c in args.configs:
        name, _, rest = c.partition("=")
        exe, *flags = rest.split(",")
        configs.append((name, exe, flags))
    if not args.fast_loop:
        prepare_data(args.python)
    results = {name: [] for name, _, _ in configs}
    tmp = args.keep or tempfile.mkdtemp()
    os.makedirs(tmp, exist_ok=True)
    for rep in range(args.repeats):
        for name, exe, flags in configs:
            p = os.path.join(tmp, f"{name}{rep}.stallscope")
            j = os.path.join(tmp, f"{name}{rep}.json")
            r = one_run(exe, flags, args.python, args.iters, 29650 + rep, p, j,
                        args.example_args.split(),
                        (args.fast_loop, args.seconds) if args.fast_loop else None)
            results[name].append(r)
            print(f"{name} #{rep}: {r['wall']:.1f} s, median iteration "
                  f"{r['median_iteration']:.3f} s, CPU {r['cpu_pct']:.2f}% of a core, "
                  f"{r['bytes']} B = {r['mb_per_hour']:.1f} MB/h", file=sys.stderr, flush=True)
            if not args.keep:
                os.remove(p)
                os.remove(j)
    print("| configuration | runs | wall (s) | stallscope CPU, % of one core: min / median / max "
          "| profile, MB per hour: min / median / max |")
    print("|---|---|---|---|---|")
    for name, _, flags in configs:
        rs = results[name]
        print(f"| {name} {' '.join(flags)} | {len(rs)} | {spread([r['wall'] for r in rs], '{:.1f}')} "
              f"| {spread([r['cpu_pct'] for r in rs])} | {spread([r['mb_per_hour'] for r in rs], '{:.1f}')} |")
    if not args.keep:
        shutil.rmtree(tmp)  # with any slowdown traces the runs wrote beside their profiles


if __name__ == "__main__":
    main()
