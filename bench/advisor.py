#!/usr/bin/env python3
"""Checks `stallscope advise` against measurement on local "instance shapes".

A shape is what this machine can vary: the link rate between two network-namespace nodes
(tbf), the CPUs a run may use (taskset), and the storage read rate (a blkio cgroup's
read_bps_device on the dataset's disk, the dataset evicted from the page cache before each run). The shapes are written as a catalog CSV, so the
advisor reads them exactly as it reads a cloud catalog. For each pair (A, B) the example
training is profiled on shape A, `stallscope advise --current A` predicts the mean iteration
on B (what the time to train follows from), then B is run and its mean measured; the error is
(predicted - measured) / measured. A pair A:A is the model's check on itself: the measured
shape predicting its own mean.

The "net" shapes are two nodes of one job, one rank each, each node profiled by its own
`stallscope run` (as a user profiles a multi-node job); the advisor reads node 0's profile
alone, with no node count given: the ranks' meta (world_size 2, local_world_size 1) tells it
the job had 2 nodes, though both namespaces have the one host name. Each shape runs --reps times; the table gives the median
prediction from A's runs against B's min/median/max of the runs' means, and B's median
iteration beside it (a loader-bound job alternates between ready and waiting iterations, so
its median is no estimate of its time).

    sudo python3 bench/advisor.py [--reps 3] [--iters 20] [--pairs net100:net50,...]
         [--markdown FILE] [--json FILE] [--keep | --from FOLDER] [--stallscope BIN]

`--keep` keeps the profiles; `--from FOLDER` runs nothing and predicts from them again, so two
builds of the advisor can be compared on the same measurements.

Needs root (namespaces, blkio cgroups). Prints a Markdown table.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DATA, EXAMPLE, REPO, block_device_of, prepare_data  # noqa: E402

NETNS = os.path.join(REPO, "scripts/netns.sh")

# name -> (kind, value): "net" shapes are two nodes, one rank each, at a tbf rate in Mbit/s;
# "cpu" shapes are one rank with loader workers on that many CPUs; "disk" shapes are one rank
# with loader workers reading a cold dataset at that many kB/s.
SHAPES = {
    "net30": ("net", 30),
    "net50": ("net", 50),
    "net100": ("net", 100),
    "net200": ("net", 200),
    "net400": ("net", 400),
    "net1000": ("net", 1000),
    # net100 with the gradients compressed to FP16 (DDP's fp16_compress_hook): checks the
    # compression advice's gain, predicted from a plain net100 profile.
    "net100fp16": ("net", 100),
    "cpu1": ("cpu", 1),
    "cpu2": ("cpu", 2),
    "disk250": ("disk", 250),
    "disk1000": ("disk", 1000),
}
DEFAULT_PAIRS = ("net100:net50,net100:net200,net100:net400,net50:net200,net400:net100,"
                 "cpu2:cpu1,cpu1:cpu2,disk250:disk1000,disk1000:disk250,net1000:net100,net100:net1000")
NET_ARGS = ["--workers", "0", "--batch", "8", "--image-size", "32", "--width", "32", "--images", "128"]
CPU_ARGS = ["--workers", "2", "--batch", "8", "--image-size", "32", "--width", "16", "--images", "128",
            "--data-delay-ms", "10"]
# More images than a run reads (4 x 20 iterations of 8, and the prefetched batches), so that
# every read is cold.
DISK_IMAGES = 2048
DISK_ARGS = ["--workers", "2", "--batch", "8", "--image-size", "64", "--width", "16",
             "--images", str(DISK_IMAGES)]
BLKIO = "/sys/fs/cgroup/blkio"
# Shapes whose training runs with extra flags.
EXTRA_ARGS = {"net100fp16": ["--comm-hook", "fp16"]}
# Advice whose gain is checked: (profiled on, advice kind, the shape that follows it).
DEFAULT_ADVICE = "net100:compression:net100fp16"


def catalog_csv():
    """The shapes as a catalog in SkyPilot's columns plus NetworkGbps."""
    rows = ["InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,NetworkGbps,"
            "StorageMBps"]
    for name, (kind, v) in SHAPES.items():
        if kind == "net":
            rows.append(f"{name},,0,{os.cpu_count()},4,1.0,{v / 1000},")
        elif kind == "cpu":
            rows.append(f"{name},,0,{v},4,{0.5 * v},,")
        else:
            rows.append(f"{name},,0,{os.cpu_count()},4,1.0,,{v / 1000}")
    return "\n".join(rows) + "\n"


def run_net(args, shape, out, port):
    """Two nodes, one rank each, at the shape's rate; returns node 0's profile."""
    prefix = f"adv{os.getpid() % 10000}"
    net = str(150 + os.getpid() % 50)
    subprocess.run(["bash", NETNS, "up", prefix, f"{SHAPES[shape][1]}mbit", "--net", net],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        procs = []
        for node in range(2):
            ns = prefix + "ab"[node]
            # What torchrun sets on each node of a 2-node job of one rank per node.
            env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", RANK=str(node), LOCAL_RANK="0",
                       LOCAL_WORLD_SIZE="1", WORLD_SIZE="2", MASTER_ADDR=f"10.77.{net}.1",
                       MASTER_PORT=str(port))
            cmd = ["ip", "netns", "exec", ns, args.stallscope, "run", "-q", "-o",
                   f"{out}.node{node}.stallscope", "--", args.python, EXAMPLE, "--iters",
                   str(args.iters), "--data-dir", DATA] + NET_ARGS + EXTRA_ARGS.get(shape, [])
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise RuntimeError(f"{shape}: a node failed")
    finally:
        subprocess.run(["bash", NETNS, "down", prefix], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return f"{out}.node0.stallscope", 2


def run_cpu(args, shape, out, port):
    cpus = ",".join(str(c) for c in range(SHAPES[shape][1]))
    # 4x the iterations: these are short, and loader CPU needs the workers seen for a while.
    cmd = ["taskset", "-c", cpus, args.stallscope, "run", "-q", "-o", f"{out}.stallscope", "--",
           args.python, EXAMPLE, "--iters", str(4 * args.iters), "--port", str(port), "--data-dir",
           DATA] + CPU_ARGS
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f"{out}.stallscope", 1


def disk_data(python):
    """The larger generated dataset the disk shapes read (made once)."""
    code = (f"import sys; sys.argv=['train.py']; sys.path.insert(0, {os.path.dirname(EXAMPLE)!r}); "
            f"import train; print(train.ensure_dataset({DATA!r}, {DISK_IMAGES}, 64, 0))")
    return subprocess.run([python, "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_disk(args, shape, out, port):
    """One rank, two workers, reading the cold dataset through a blkio limit of the shape's
    rate; the run and everything it starts is in the cgroup."""
    folder = disk_data(args.python)
    group = os.path.join(BLKIO, f"stallscope-advisor-{os.getpid()}")
    os.makedirs(group, exist_ok=True)
    try:
        with open(os.path.join(group, "blkio.throttle.read_bps_device"), "w") as f:
            f.write(f"{block_device_of(folder)} {SHAPES[shape][1] * 1000}\n")
        # Only the dataset is made cold (posix_fadvise): dropping the whole page cache would
        # have torch's libraries read through the limit too, for minutes.
        subprocess.run([args.stallscope, "cache-evict", "--dataset-dir", folder, "--cold-cache",
                        "fadvise"], check=True, stdout=subprocess.DEVNULL)
        cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(group, "cgroup.procs"),
               args.stallscope, "run", "-q", "-o", f"{out}.stallscope", "--", args.python,
               EXAMPLE, "--iters", str(4 * args.iters), "--port", str(port), "--data-dir",
               DATA] + DISK_ARGS
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        try:
            os.rmdir(group)
        except OSError:
            pass
    return f"{out}.stallscope", 1


def advise(args, catalog, profile, shape, nodes):
    """The advisor's JSON for a profile measured on `shape`, a job of `nodes` nodes: the
    profile alone tells the advisor how many (it is told nothing), and a count read wrong is
    said on stderr."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([args.stallscope, "advise", profile, "--catalog", catalog, "--current",
                        shape, "--warmup", "3", "--json", f.name], check=True,
                       stdout=subprocess.DEVNULL)
        report = json.load(open(f.name))
    read = report["measured"]["nodes"]
    if read != nodes:
        print(f"# WARNING {profile}: the advisor read {read} node(s) of a {nodes}-node job",
              file=sys.stderr)
    return report


def measure_shape(args, catalog, shape, rep, work):
    kind = SHAPES[shape][0]
    out = os.path.join(work, f"{shape}-{rep}")
    if args.from_dir:  # the profile a run with --keep left there
        profile, nodes = (f"{out}.node0.stallscope", 2) if kind == "net" else (f"{out}.stallscope", 1)
        return advise(args, catalog, profile, shape, nodes)
    port = 29700 + (hash((shape, rep)) % 200)
    run = {"net": run_net, "cpu": run_cpu, "disk": run_disk}[kind]
    profile, nodes = run(args, shape, out, port)
    return advise(args, catalog, profile, shape, nodes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/debug/stallscope"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--pairs", default=DEFAULT_PAIRS)
    ap.add_argument("--advice", default=DEFAULT_ADVICE,
                    help="A:KIND:B,...: the gain of advice KIND predicted on A, against running B "
                         "(A with the advice followed); empty for none")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the profiles (their folder is printed)")
    ap.add_argument("--from", dest="from_dir",
                    help="run nothing: predict from the profiles a --keep run left in this folder "
                         "(with another --stallscope, the same profiles predicted by another build)")
    args = ap.parse_args()
    if args.iters < 16:
        # The hook sends the buckets' ready times (comm_bucket_ready_ms, comm_overlap_us) once
        # 16 backwards have run: without them the replay has no overlap with backward.
        print("# WARNING: --iters under 16: the net shapes' profiles will lack the buckets' "
              "ready times", file=sys.stderr)
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    checks = [tuple(c.split(":")) for c in args.advice.split(",") if c]
    shapes = sorted({s for p in pairs for s in p} | {s for c in checks for s in (c[0], c[2])})
    if args.from_dir:
        run(args, pairs, checks, shapes, args.from_dir)
        return
    prepare_data(args.python)
    work = tempfile.mkdtemp(prefix="stallscope-advisor-")
    try:
        run(args, pairs, checks, shapes, work)
    finally:
        if args.keep:
            print(f"# profiles kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args, pairs, checks, shapes, work):
    """Measures every shape, predicts each pair and advice, prints (and writes) the tables."""
    catalog = os.path.join(work, "shapes.csv")
    open(catalog, "w").write(catalog_csv())
    load = os.getloadavg()[0]
    reports = {s: [] for s in shapes}
    for rep in range(args.reps):  # interleaved, so slow spells of the machine hit every shape
        for s in shapes:
            t0 = time.time()
            reports[s].append(measure_shape(args, catalog, s, rep, work))
            print(f"# {s} rep {rep}: {reports[s][-1]['measured']['iteration_seconds']:.3f} s "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    rows = []
    for a, b in pairs:
        preds, uncertain = [], False
        for r in reports[a]:
            p = next(i for i in r["instances"] if i["instance_type"] == b)
            preds.append(p["predicted_iteration_seconds"])
            uncertain |= bool(p["extrapolations"])
        meas = [r["measured"]["iteration_seconds"] for r in reports[b]]
        pred, med = statistics.median(preds), statistics.median(meas)
        rows.append(dict(profiled=a, predicted_for=b, predicted=pred, uncertain=uncertain,
                         profiled_mean=statistics.median(
                             r["measured"]["iteration_seconds"] for r in reports[a]),
                         measured_min=min(meas), measured_median=med, measured_max=max(meas),
                         median_iteration=statistics.median(
                             r["measured"]["median_iteration_seconds"] for r in reports[b]),
                         error=(pred - med) / med))
    lines = [f"load average at start {load:.2f}; {args.reps} runs per shape, {args.iters} "
             f"iterations each (3 left out as warm-up); * the advisor said the prediction is "
             f"outside what was measured", "",
             "| profiled on | mean there (s) | predicted for | predicted mean (s) | measured mean: min / median / max of runs (s) | error | its median iteration (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['profiled']} | {r['profiled_mean']:.3f} | {r['predicted_for']} | "
                     f"{r['predicted']:.3f}{' *' if r['uncertain'] else ''} | {r['measured_min']:.3f} / {r['measured_median']:.3f}"
                     f" / {r['measured_max']:.3f} | {r['error'] * 100:+.1f}% | "
                     f"{r['median_iteration']:.3f} |")
    if checks:
        lines += ["", "| profiled on | advice | mean there (s) | predicted gain (s) | predicted mean "
                  "with it (s) | measured on | measured mean: min / median / max (s) | error |",
                  "|---|---|---|---|---|---|---|---|"]
    for a, kind, b in checks:
        there = [r["measured"]["iteration_seconds"] for r in reports[a]]
        gains = [next((x["gain_seconds"] for x in r["communication"] + r["data"]
                       if x["kind"] == kind), 0.0) for r in reports[a]]
        pred = statistics.median(t - g for t, g in zip(there, gains))
        meas = [r["measured"]["iteration_seconds"] for r in reports[b]]
        med = statistics.median(meas)
        lines.append(f"| {a} | {kind} | {statistics.median(there):.3f} | "
                     f"{statistics.median(gains):.3f} | {pred:.3f} | {b} | {min(meas):.3f} / "
                     f"{med:.3f} / {max(meas):.3f} | {(pred - med) / med * 100:+.1f}% |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text + "\n")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
