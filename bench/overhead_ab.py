#!/usr/bin/env python3
"""Paired runs with and without stallscope: the iteration-time ratio and stallscope's own CPU.

The job is the example DDP training with 2 ranks and 2 DataLoader workers per rank: by default
as in bench/overhead.py (the example's own `--nproc 2`), with `--launch` the issue-31 job
(`stallscope launch --nproc-per-node 2 -- python3 train.py --workers 2`, the launcher being the
plain run's too). Each repeat runs every configuration once — one or two builds (`--a`, `--b`)
and the job without stallscope — in an order that rotates from repeat to repeat, so the
machine's slow and fast spells and its load from other work hit them all alike; a build's
runs are paired with the plain run of the same repeat. For each build:

- ratio: the build's median iteration over the plain run's, per pair; printed as the median of
  the pairs' ratios with their min / quartiles / max (the spread says what one pair is worth
  on this machine).
- CPU: `profiler_cpu_seconds` of the summary (the `run` process's own getrusage: all its
  threads, none of the training's) over the run's wall time, as a share of one core, from
  the start to the end of the run.

The load average (1 min) is printed at every run, and its min / median / max at the end.

    python3 bench/overhead_ab.py --a OLD/stallscope [--b NEW/stallscope] [--repeats 7] \
        [--iters 60] [--launch] [--example-args "--width 8"] [--a-env KEY=VALUE]
        [--b-env KEY=VALUE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from common import launch_job, overhead_job, prepare_data

TIME_RE = re.compile(r"^iter (\d+) .*time_ms ([0-9.]+)", re.M)


def spread(xs, fmt="{:.2f}"):
    return " / ".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def quartiles(xs):
    """min, lower quartile, median, upper quartile, max."""
    if len(xs) < 2:
        return (xs[0],) * 5
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return min(xs), q1, q2, q3, max(xs)


def load1():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first build (the baseline)")
    ap.add_argument("--b", help="a second build, to compare with the first")
    ap.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for build A's runs only, e.g. STALLSCOPE_PCAP=off "
                         "to compare a switch within one build (--b the same binary)")
    ap.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for build B's runs only, e.g. STALLSCOPE_EBPF=on")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--launch", action="store_true",
                    help="the issue-31 job: ranks started by `stallscope launch` (build A's)")
    ap.add_argument("--example-args", default="",
                    help="more flags for the example, e.g. '--width 8' for shorter iterations")
    args = ap.parse_args()
    extra = args.example_args.split()
    a_env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.a_env))
    b_env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.b_env))
    prepare_data(args.python)
    builds = [("A", args.a)] + ([("B", args.b)] if args.b else []) + [("plain", None)]
    cpu = {name: [] for name, _ in builds}
    iters = {name: [] for name, _ in builds}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            port = 29613 + rep % 50
            train = (launch_job(args.python, args.iters, port, args.a, extra) if args.launch
                     else overhead_job(args.python, args.iters, port) + extra)
            shift = rep % len(builds)
            for name, exe in builds[shift:] + builds[:shift]:
                js = os.path.join(tmp, f"{name}{rep}.json")
                cmd = train if exe is None else [
                    exe, "run", "-q", "-o", os.path.join(tmp, f"{name}{rep}.stallscope"),
                    "--summary-json", js, "--"] + train
                loads.append(load1())
                t0 = time.monotonic()
                out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={"A": a_env, "B": b_env}.get(name))
                wall = time.monotonic() - t0
                times = [float(ms) / 1000 for it, ms in TIME_RE.findall(out.stdout)
                         if int(it) >= args.warmup]
                iters[name].append(statistics.median(times))
                line = f"{name} #{rep}: {wall:.1f} s, median iteration {iters[name][-1]:.4f} s"
                if exe is not None:
                    with open(js) as f:
                        cpu[name].append(100 * json.load(f)["profiler_cpu_seconds"] / wall)
                    # A slowdown found keeps the run's samples (a larger profile) and writes
                    # a trace: costs that come and go with the machine's swings.
                    size = os.path.getsize(os.path.join(tmp, f"{name}{rep}.stallscope"))
                    traces = [f for f in os.listdir(tmp) if f.startswith(f"{name}{rep}.")
                              and f.endswith(".trace.json")]
                    line += (f", CPU {cpu[name][-1]:.2f}% of a core, profile {size} B"
                             f"{', slowdown trace written' if traces else ''}")
                print(f"{line}, load {loads[-1]:.1f}", file=sys.stderr, flush=True)
    job = "stallscope launch (issue 31)" if args.launch else "the example's --nproc 2"
    print(f"{args.repeats} rotated repeats of {args.iters} iterations each ({job}"
          f"{', ' + args.example_args if extra else ''}); A = {args.a}"
          f"{' with ' + ' '.join(args.a_env) if args.a_env else ''}"
          f"{', B = ' + args.b if args.b else ''}"
          f"{' with ' + ' '.join(args.b_env) if args.b_env else ''}; load average (1 min) at the runs' starts: "
          f"{spread(loads, '{:.1f}')}\n")
    print("| build | stallscope CPU, % of one core: min / median / max | median iteration (s): "
          "min / median / max | per-pair ratio to plain: median | min / Q1 / Q3 / max |")
    print("|---|---|---|---|---|")
    for name, exe in builds:
        it = spread(iters[name], "{:.4f}")
        if exe is None:
            print(f"| plain | — | {it} | — | — |")
            continue
        ratios = [b / p for b, p in zip(iters[name], iters["plain"])]
        lo, q1, med, q3, hi = quartiles(ratios)
        print(f"| {name} | {spread(cpu[name])} | {it} | {med:.3f} | "
              f"{lo:.3f} / {q1:.3f} / {q3:.3f} / {hi:.3f} |")


if __name__ == "__main__":
    main()
