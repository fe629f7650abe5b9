#!/usr/bin/env python3
"""Overhead of `stallscope run`: its own CPU time per second of training, and the training's
iteration time with and without it.

The job is the example DDP training with 2 ranks and 2 DataLoader workers per rank. Runs
alternate (plain, 100 Hz, 10 Hz, plain, ...) so that drift of the machine hits every
configuration alike. stallscope's CPU comes from its own getrusage (all its threads, not the
training's), reported as `profiler_cpu_seconds` in the summary JSON; iteration times are the
per-iteration `time_ms` lines rank 0 prints, warm-up iterations left out.

    python3 bench/overhead.py [--python /usr/bin/python3] [--iters 60] [--repeats 3]

Prints a Markdown table for docs/BENCHMARKS.md.
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

from common import add_binary_args, overhead_job, prepare_data

TIME_RE = re.compile(r"^iter (\d+) .*time_ms ([0-9.]+)", re.M)


def iteration_times(stdout, warmup):
    return [float(ms) / 1000 for it, ms in TIME_RE.findall(stdout) if int(it) >= warmup]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_binary_args(ap)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    train = overhead_job(args.python, args.iters, 29611)
    prepare_data(args.python)
    configs = [("without stallscope", None), ("stallscope 100 Hz", 100), ("stallscope 10 Hz", 10),
               ("stallscope 100 Hz, --no-auto (sampling only)", "100-noauto")]
    times = {name: [] for name, _ in configs}
    cpu = {name: [] for name, _ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, rate in configs:
                if rate is None:
                    cmd = train
                else:
                    js = os.path.join(tmp, f"s{rep}-{rate}.json")
                    hz = str(rate).split("-")[0]
                    extra = ["--no-auto"] if str(rate).endswith("noauto") else []
                    cmd = [args.stallscope, "run", "-q", "--rate", hz] + extra + ["-o",
                           os.path.join(tmp, f"p{rep}-{rate}.stallscope"), "--summary-json", js, "--"] + train
                t0 = time.monotonic()
                out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                wall = time.monotonic() - t0
                times[name].extend(iteration_times(out.stdout, args.warmup))
                if rate is not None:
                    s = json.load(open(js))
                    cpu[name].append(s["profiler_cpu_seconds"] / s["wall_seconds"])
                print(f"# {name} run {rep + 1}: {wall:.1f} s", file=sys.stderr)
    base = statistics.median(times["without stallscope"])
    print("| configuration | median iteration (s) | ratio to without | stallscope CPU (% of one core) |")
    print("|---|---|---|---|")
    for name, rate in configs:
        med = statistics.median(times[name])
        c = f"{100 * statistics.median(cpu[name]):.2f}" if cpu[name] else "—"
        print(f"| {name} | {med:.4f} | {med / base:.3f} | {c} |")
    print(f"\n{len(times['without stallscope'])} iterations per configuration, "
          f"{args.repeats} alternating runs of {args.iters} iterations, first {args.warmup} left out; "
          f"python {args.python}")


if __name__ == "__main__":
    main()
