#!/usr/bin/env python3
"""Accuracy of the online breakdown against the differential ground truth.

Runs a matrix of real PyTorch DDP scenarios (examples/pytorch_ddp/train.py) with
`stallscope experiment`, which runs each configuration under `stallscope run`: the online
breakdown of the real-data run is held against the stalls measured by difference. For each
scenario and category it prints the online share, the differential share and the absolute
difference in percentage points, as a Markdown table (docs/BENCHMARKS.md holds the last one).

    sudo python3 bench/accuracy.py [--python /usr/bin/python3] [--only prep,fetch,...]
        [--iters 12] [--rounds 1] [--out DIR]

With --rounds K each scenario's experiment runs K times, scenarios alternating, and the table
gives the mean over rounds of the online and of the differential shares (so a host whose CPU
speed swings between runs weighs on both sides alike), then each round's largest difference
(min / median / max), so that one lucky or unlucky round cannot make the figure.

Scenarios (CPU training, 2 processes):
  prep     2 ranks, no loader workers, 25 ms of CPU per sample: preparation-bound
  fetch    2 ranks, cold cache, dataset reads throttled by a blkio cgroup (read_bps_device);
           the dataset on a loop-mounted filesystem of its own, the only disk throttled
  network  2 nodes in network namespaces, 1 rank each, eth0 shaped by tbf
  mixed    2 nodes, shaped, and 12 ms of CPU per sample
  balanced 2 ranks on one node, light preparation, nothing dominating
  loaders  2 ranks, 2 loader workers each, 10 ms of CPU per sample: the loop waits for its
           workers part of the time, and they share the cores with it (not in the default
           set; the online shares are what to compare between builds: the differential
           counts the workers' contention for the CPU as preparation)
Needs root (namespaces, cgroups, a loop device); what needs root and is not available is
skipped with a reason.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block_device_of  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "examples/pytorch_ddp/train.py")
NETNS = os.path.join(REPO, "scripts/netns.sh")
BLKIO = "/sys/fs/cgroup/blkio"
CATEGORIES = ["compute", "data_fetch", "data_prep", "interconnect", "network", "peer_wait", "other"]


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


class Throttle:
    """A blkio cgroup limiting reads of the dataset's disk; the experiment runs inside it."""

    def __init__(self, path, bytes_per_s):
        self.dir = os.path.join(BLKIO, "stallscope-bench-{}".format(os.getpid()))
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "blkio.throttle.read_bps_device"), "w") as f:
            f.write("{} {}\n".format(block_device_of(path), bytes_per_s))

    def wrap(self, cmd):
        # The shell joins the cgroup, then becomes the experiment: all its children inherit it.
        procs = os.path.join(self.dir, "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs] + cmd

    def close(self):
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


class LoopDisk:
    """A filesystem of its own (ext4 in a file, on a loop device with direct I/O), so the
    blkio throttle slows the dataset's reads only. Throttling the disk that also holds Python,
    torch and their libraries made every page of them the kernel reclaimed and faulted back in
    (4 kB at a time, 10 ms each at 400 kB/s) a stall in the warm reference run (R3) too."""

    def __init__(self, root, size_mb=128):
        os.makedirs(root, exist_ok=True)
        self.image = os.path.join(root, "disk.img")
        self.mount = os.path.join(root, "mnt")
        os.makedirs(self.mount, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(size_mb << 20)
        sh("mkfs.ext4", "-q", "-F", self.image)
        self.loop = sh("losetup", "--find", "--show", "--direct-io=on", self.image).strip()
        sh("mount", self.loop, self.mount)

    def close(self):
        subprocess.run(["umount", self.mount], capture_output=True)
        subprocess.run(["losetup", "-d", self.loop], capture_output=True)
        try:
            os.remove(self.image)
        except OSError:
            pass


class Cluster:
    """Two nodes in network namespaces, eth0 shaped to ``rate``."""

    def __init__(self, prefix, rate, net):
        self.prefix = prefix
        out = sh("bash", NETNS, "up", prefix, rate, "--net", str(net))
        self.nodes = [line.split() for line in out.splitlines() if line.strip()]

    def close(self):
        subprocess.run(["bash", NETNS, "down", self.prefix], capture_output=True)


def make_dataset(python, root, images, size):
    code = (
        "import sys; sys.argv=['train.py']; sys.path.insert(0, {!r}); import train; "
        "print(train.ensure_dataset({!r}, {}, {}, 0))"
    ).format(os.path.dirname(TRAIN), root, images, size)
    return sh(python, "-c", code).strip()


def experiment(args, name, stallscope, train_flags, nproc=2, dataset=None, cluster=None,
               throttle=None, configs=None):
    out_dir = os.path.join(args.out, name if args.round == 0 else "{}.{}".format(name, args.round))
    os.makedirs(out_dir, exist_ok=True)
    result = os.path.join(out_dir, "result.json")
    cmd = [stallscope, "experiment", "-q", "--nproc", str(nproc), "--iters", str(args.iters),
           "--warmup", "3", "-o", os.path.join(out_dir, "e.stallscope"), "--json", result]
    if configs:
        cmd += ["--configs", configs]
    if dataset:
        cmd += ["--dataset-dir", dataset, "--cold-cache", "fadvise"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if cluster:
        (a, addr_a), (b, _) = cluster.nodes[:2]
        cmd += ["--nodes", "{},{}".format(a, b), "--master-addr", addr_a,
                "--node-launch", "ip netns exec {node} env GLOO_SOCKET_IFNAME=eth0"]
    cmd += ["--", args.python, TRAIN, "--iters", "1000"] + train_flags
    if cluster:
        # stallscope runs on the first node: its NIC counters see the job's traffic.
        cmd = ["ip", "netns", "exec", cluster.nodes[0][0]] + cmd
    if throttle:
        cmd = throttle.wrap(cmd)
    print("## {}: {}".format(name, " ".join(cmd)), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    with open(os.path.join(out_dir, "stdout.txt"), "w") as f:
        f.write(proc.stdout)
    with open(os.path.join(out_dir, "stderr.txt"), "w") as f:
        f.write(proc.stderr)
    if proc.returncode != 0 or not os.path.exists(result):
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise RuntimeError("{}: experiment exited with {}".format(name, proc.returncode))
    print(proc.stdout, file=sys.stderr, flush=True)
    with open(result) as f:
        return json.load(f)


def mean_agreement(experiments):
    """The experiments' agreement rows averaged per category (a differential absent in any
    round is absent), and each round's largest difference in points."""
    by_category = {}
    worst = []
    for e in experiments:
        round_worst = 0.0
        for a in e["agreement"]:
            by_category.setdefault(a["category"], []).append(a)
            d = a["differential"]
            if d is not None:
                round_worst = max(round_worst, abs(a["online"] - d) * 100)
        worst.append(round_worst)
    rows = []
    for category, rows_of in by_category.items():
        online = sum(a["online"] for a in rows_of) / len(rows_of)
        diffs = [a["differential"] for a in rows_of]
        differential = None if any(d is None for d in diffs) else sum(diffs) / len(diffs)
        rows.append({"category": category, "online": online, "differential": differential})
    return {"agreement": rows, "differential": experiments[0]["differential"]}, sorted(worst)


def table(results):
    rounds = {}
    for name, e in results:
        rounds.setdefault(name, []).append(e)
    per_round_worst = {}
    if any(len(es) > 1 for es in rounds.values()):
        merged = []
        for name, es in rounds.items():
            mean, worst = mean_agreement(es)
            merged.append((name, mean))
            per_round_worst[name] = worst
        results = merged
    lines = [
        "| scenario | category | online | differential | difference (points) |",
        "|---|---|---:|---:|---:|",
    ]
    summary = []
    for name, e in results:
        worst = 0.0
        basis = e["differential"]["basis"]
        for a in e["agreement"]:
            d = a["differential"]
            if d is None and a["online"] < 0.005:
                continue
            err = None if d is None else abs(a["online"] - d) * 100
            if err is not None:
                worst = max(worst, err)
            lines.append("| {} ({}) | {} | {:.1f}% | {} | {} |".format(
                name, basis, a["category"], a["online"] * 100,
                "-" if d is None else "{:.1f}%".format(d * 100),
                "-" if err is None else "{:.1f}".format(err)))
        summary.append((name, worst))
    lines.append("")
    if per_round_worst:
        lines.append("| scenario | largest difference of the means (points) | "
                     "each round's largest: min / median / max | rounds |")
        lines.append("|---|---:|---|---:|")
        for name, worst in summary:
            w = per_round_worst[name]
            lines.append("| {} | {:.1f} | {:.1f} / {:.1f} / {:.1f} | {} |".format(
                name, worst, w[0], w[len(w) // 2], w[-1], len(w)))
    else:
        lines.append("| scenario | largest difference (points) |")
        lines.append("|---|---:|")
        for name, worst in summary:
            lines.append("| {} | {:.1f} |".format(name, worst))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/release/stallscope"))
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--only", default="prep,fetch,network,mixed,balanced")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each scenario this many times, alternating, and average")
    ap.add_argument("--fetch-bps", type=int, default=400_000, help="blkio read limit, bytes/s")
    ap.add_argument("--rate", default="100mbit", help="tbf rate of the network scenarios")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/accuracy.py needs root (network namespaces, blkio cgroups)")
    if args.stallscope == os.path.join(REPO, "target/release/stallscope"):
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "stallscope"],
                       cwd=REPO, check=True)
    args.out = args.out or tempfile.mkdtemp(prefix="stallscope-accuracy-")
    data_root = os.path.join(args.out, "data")
    wanted = args.only.split(",")
    results = []
    small = make_dataset(args.python, data_root, 512, 64)
    common = ["--workers", "0", "--batch", "8", "--data-dir", data_root, "--images", "512"]
    for args.round in range(max(1, args.rounds)):
        if "prep" in wanted:
            results.append(("prep", experiment(args, "prep", args.stallscope,
                                               common + ["--data-delay-ms", "25"], dataset=small)))
        if "fetch" in wanted:
            disk = LoopDisk(os.path.join(args.out, "fetch-disk"))
            try:
                big = make_dataset(args.python, disk.mount, 2048, 64)
                throttle = Throttle(big, args.fetch_bps)
                try:
                    flags = ["--workers", "0", "--batch", "8", "--data-dir", disk.mount,
                             "--images", "2048"]
                    results.append(("fetch", experiment(args, "fetch", args.stallscope, flags,
                                                        dataset=big, throttle=throttle)))
                finally:
                    throttle.close()
            finally:
                disk.close()
        for name, delay in (("network", "0"), ("mixed", "12")):
            if name not in wanted:
                continue
            cluster = Cluster("ssacc", args.rate, 91)
            try:
                flags = common + ["--width", "32", "--data-delay-ms", delay]
                results.append((name, experiment(args, name, args.stallscope, flags, dataset=small,
                                                 cluster=cluster)))
            finally:
                cluster.close()
        if "balanced" in wanted:
            results.append(("balanced", experiment(args, "balanced", args.stallscope,
                                                   common + ["--data-delay-ms", "4"], dataset=small)))
        if "loaders" in wanted:
            flags = ["--workers", "2"] + common[2:] + ["--data-delay-ms", "10"]
            results.append(("loaders", experiment(args, "loaders", args.stallscope, flags,
                                                  dataset=small)))
    print(table(results))
    print("\n(results and profiles in {})".format(args.out))
    if not args.out.startswith(REPO):
        shutil.rmtree(data_root, ignore_errors=True)


if __name__ == "__main__":
    main()
