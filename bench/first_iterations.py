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
import subprocess
import tempfile

from common import DATA, EXAMPLE, add_ab_args, prepare_data, run_alternated

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ab_args(ap, repeats=8)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--data-delay-ms", type=int, default=40)
    args = ap.parse_args()
    prepare_data(args.python)
    run_alternated(
        args,
        lambda binary, env: one_run(binary, args.python, env, args.data_delay_ms),
        CATEGORIES)


if __name__ == "__main__":
    main()
