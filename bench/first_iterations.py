#!/usr/bin/env python3
"""How the first iterations of a run with a decoding loader worker are attributed.

The job is the example training with one DataLoader worker that decodes on a helper thread
(`--data-on-thread`: the worker's main thread sleeps while the helper burns `--data-delay-ms`
of CPU per image), 12 iterations of 4 images: a short run, so its first second weighs. The
loop's wait for data is the worker's preparation (`data_prep`) only if the worker's other
threads are watched by then; before they are, it is `other`. Each build (`--a`, `--b`) runs
`--repeats` times, alternating; for each the fractions of `data_prep`, `compute` and `other`
over the run (the summary's job categories, first iteration left out as the summary does) are
printed as min / median / max, with the load average (1 min) at each run.

    python3 bench/first_iterations.py --a OLD/stallscope [--b NEW/stallscope] [--repeats 8] \
        [--python /root/.cache/stallscope/torch-2.9.1/bin/python] [--a-env STALLSCOPE_EBPF=off]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from common import DATA, EXAMPLE, prepare_data

CATEGORIES = ("data_prep", "compute", "other")


def one_run(stallscope, python, env, data_delay_ms):
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "s.json")
        subprocess.run(
            [stallscope, "run", "-q", "-o", os.path.join(d, "p.stallscope"), "--summary-json",
             summary, "--", python, EXAMPLE, "--iters", "12", "--workers", "1", "--batch", "4",
             "--data-delay-ms", str(data_delay_ms), "--data-on-thread", "--images", "64",
             "--data-dir", DATA],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **env})
        with open(summary) as f:
            categories = json.load(f)["job"]["categories"]
    return {c: categories[c]["fraction"] for c in CATEGORIES}


def parse_env(pairs):
    return dict(p.split("=", 1) for p in pairs or [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="a stallscope binary")
    ap.add_argument("--b", help="another stallscope binary, alternated with --a")
    ap.add_argument("--a-env", action="append", help="KEY=VALUE for --a's runs")
    ap.add_argument("--b-env", action="append", help="KEY=VALUE for --b's runs")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--data-delay-ms", type=int, default=40)
    args = ap.parse_args()
    prepare_data(args.python)
    builds = [("a", args.a, parse_env(args.a_env))]
    if args.b:
        builds.append(("b", args.b, parse_env(args.b_env)))
    results = {name: [] for name, _, _ in builds}
    for repeat in range(args.repeats):
        order = builds if repeat % 2 == 0 else builds[::-1]
        for name, binary, env in order:
            load = os.getloadavg()[0]
            fractions = one_run(binary, args.python, env, args.data_delay_ms)
            results[name].append(fractions)
            shown = " ".join(f"{c}={fractions[c]:.3f}" for c in CATEGORIES)
            print(f"{name} run {repeat + 1}: {shown} (load {load:.2f})", flush=True)
    for name, binary, env in builds:
        print(f"{name}: {binary} {env or ''}")
        for c in CATEGORIES:
            xs = [r[c] for r in results[name]]
            print(f"  {c:9} min {min(xs):.3f}  median {statistics.median(xs):.3f}  "
                  f"max {max(xs):.3f}")


if __name__ == "__main__":
    main()
