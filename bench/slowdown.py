#!/usr/bin/env python3
"""Detection delay and false alarms of the slowdown watch (analysis/src/slowdown/) on real
two-rank trainings.

Each job is the example's two-rank DDP training (examples/pytorch_ddp/train.py, gloo on CPU,
no loader workers) under ``stallscope run``. A ``slow`` job has rank 1 turn slow at iteration
``--at`` (``--slow-from AT:1:KIND:MS``); a ``steady`` job has none. For every job it reads the
summary's ``slowdowns`` and counts:

* on slow jobs: whether rank 1 was named with the right category, the error of
  ``since_iteration`` and the delay ``detected_iteration - AT``, and any other slowdown
  (a false alarm);
* on steady jobs: every slowdown (all false alarms).

    python3 bench/slowdown.py --jobs 3 --kinds data,compute,steady
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATEGORY = {"data": "data_prep", "compute": "compute"}
EXTRA_MS = {"data": "25", "compute": "300"}


def run_job(args, kind, port, work):
    """Runs one job; returns its summary's slowdowns."""
    summary = os.path.join(work, "s.json")
    cmd = [
        args.stallscope, "run", "-q", "-o", os.path.join(work, "p.stallscope"),
        "--summary-json", summary, "--",
        args.python, os.path.join(REPO, "examples/pytorch_ddp/train.py"),
        "--nproc", "2", "--port", str(port), "--iters", str(args.iters), "--workers", "0",
        "--batch", "8", "--images", "64",
    ]
    if kind != "steady":
        cmd += ["--slow-from", "{}:1:{}:{}".format(args.at, kind, EXTRA_MS[kind])]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)
    with open(summary) as f:
        return json.load(f)["slowdowns"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3, help="jobs per kind")
    p.add_argument("--kinds", default="data,compute,steady")
    p.add_argument("--at", type=int, default=30, help="iteration at which rank 1 turns slow")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--python", default=os.environ.get("STALLSCOPE_TEST_PYTHON", "/usr/bin/python3"))
    p.add_argument("--stallscope", default=os.path.join(REPO, "target/debug/stallscope"))
    args = p.parse_args()
    port = 29720
    print("{:<8} {:>4} {:>6} {:>12} {:>12} {:>12}".format(
        "kind", "job", "named", "since-AT", "detected-AT", "false alarms"))
    totals = {}
    for kind in args.kinds.split(","):
        for job in range(args.jobs):
            port += 1
            with tempfile.TemporaryDirectory() as work:
                found = run_job(args, kind, port, work)
            hit = None
            if kind != "steady":
                hit = next((d for d in found
                            if d["rank"] == 1 and d["category"] == CATEGORY[kind]), None)
            false = [d for d in found if d is not hit]
            t = totals.setdefault(kind, {"jobs": 0, "named": 0, "false": 0, "delays": []})
            t["jobs"] += 1
            t["false"] += len(false)
            if hit is not None:
                t["named"] += 1
                t["delays"].append(hit["detected_iteration"] - args.at)
            print("{:<8} {:>4} {:>6} {:>12} {:>12} {:>12}".format(
                kind, job, "-" if kind == "steady" else ("yes" if hit else "NO"),
                hit["since_iteration"] - args.at if hit else "-",
                hit["detected_iteration"] - args.at if hit else "-",
                len(false)), flush=True)
            for d in false:
                print("    false alarm: {}".format(json.dumps(d)), flush=True)
    print()
    for kind, t in totals.items():
        delays = t["delays"]
        print("{}: {} jobs, named {}, detection delay (iterations after the change) {}, false alarms {}".format(
            kind, t["jobs"], "-" if kind == "steady" else t["named"],
            "-" if not delays else "{}–{}".format(min(delays), max(delays)), t["false"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
