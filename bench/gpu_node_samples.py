#!/usr/bin/env python3
"""How much of a run on a GPU node the counters saw, and what was left to `other`.

On a node with a GPU the agent has two sampler threads: the CPU one (with the eBPF thread
states it wakes every 100 ms and sends the 100 Hz instants since) and the NVML one (a batch
every 10 ms). The job is the example training, two ranks (`--nproc 2`, no loader workers) on
the scripted GPU (`fake-nvml`, two H100s), 150 iterations. For each build (`--a`, `--b`),
`--repeats` runs, alternating; for each the summary's sampled coverage (the share of the
iterations' time that CPU samples bracketed when they were attributed) and the job's `other`
fraction, printed as min / median / max, with the load average (1 min) at each run.
`--load` adds a CPU hog that runs 0.7 s in every second, as other processes do on a busy node.

    python3 bench/gpu_node_samples.py --a OLD/stallscope [--b NEW/stallscope] [--repeats 6] \
        [--load] [--a-env STALLSCOPE_EBPF=off]

The scripted GPU library is `libstallscope_fake_nvml.so` beside the `--a` binary's target
directory (`cargo build -p stallscope-fake-nvml` builds it into target/debug).
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import DATA, EXAMPLE, add_ab_args, prepare_data, run_alternated

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_NVML = os.path.join(HERE, "..", "target", "debug", "libstallscope_fake_nvml.so")


def one_run(stallscope, env, load):
    hog = None
    if load:
        hog = subprocess.Popen(
            ["sh", "-c", "while :; do timeout 0.7 sh -c 'while :; do :; done'; sleep 0.3; done"],
            start_new_session=True)
    try:
        with tempfile.TemporaryDirectory() as d:
            summary = os.path.join(d, "s.json")
            subprocess.run(
                [stallscope, "run", "-q", "-o", os.path.join(d, "p.stallscope"),
                 "--summary-json", summary, "--", "/usr/bin/python3", EXAMPLE, "--nproc", "2",
                 "--iters", "150", "--workers", "0", "--batch", "4", "--images", "64",
                 "--data-dir", DATA],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "STALLSCOPE_NVML_LIB": FAKE_NVML,
                     "STALLSCOPE_FAKE_NVML": "gpus=2", **env})
            with open(summary) as f:
                job = json.load(f)["job"]
    finally:
        if hog is not None:
            os.killpg(hog.pid, 9)
            hog.wait()
    return {"sampled": job["coverage"]["sampled"],
            "other": job["categories"]["other"]["fraction"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ab_args(ap, repeats=6)
    ap.add_argument("--load", action="store_true", help="a CPU hog 70%% of the time")
    args = ap.parse_args()
    if not os.path.exists(FAKE_NVML):
        raise SystemExit(f"{FAKE_NVML} is missing: cargo build -p stallscope-fake-nvml")
    prepare_data("/usr/bin/python3")
    run_alternated(args, lambda binary, env: one_run(binary, env, args.load),
                   ("sampled", "other"))


if __name__ == "__main__":
    main()
