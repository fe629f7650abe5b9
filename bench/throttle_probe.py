#!/usr/bin/env python3
"""What a blkio read throttle costs a run whose dataset is warm: the storage reads of the
example training (2 ranks, no loader workers) at each iteration, with the dataset read into
the page cache first and the throttle on the disk that holds it.

    sudo python3 bench/throttle_probe.py [--bps 400000] [--data-dir DIR] [--plain]

Prints `seconds iteration read_bytes` (the cgroup's processes' `/proc/PID/io` read_bytes
summed, bytes that came from storage): growth after the start is what the warm reference run
of the accuracy matrix's fetch scenario waited for (bench/accuracy.py; docs/BENCHMARKS.md).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EXAMPLE, block_device_of  # noqa: E402


def read_bytes(procs):
    total = 0
    for line in open(procs):
        try:
            with open("/proc/{}/io".format(line.strip())) as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("read_bytes"))
        except (OSError, StopIteration):
            pass
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--bps", type=int, default=400_000)
    ap.add_argument("--data-dir", default="/tmp/stallscope-throttle-probe")
    ap.add_argument("--plain", action="store_true", help="no throttle, for comparison")
    args = ap.parse_args()
    flags = ["--workers", "0", "--batch", "8", "--images", "2048", "--data-dir", args.data_dir]
    subprocess.run([args.python, EXAMPLE, "--iters", "1"] + flags, check=True,
                   stdout=subprocess.DEVNULL)
    folder = os.path.join(args.data_dir, "n2048-s64")
    for name in os.listdir(folder):  # warm
        with open(os.path.join(folder, name), "rb") as f:
            f.read()
    cg = "/sys/fs/cgroup/blkio/stallscope-probe-{}".format(os.getpid())
    os.makedirs(cg)
    try:
        if not args.plain:
            with open(os.path.join(cg, "blkio.throttle.read_bps_device"), "w") as f:
                f.write("{} {}\n".format(block_device_of(folder), args.bps))
        procs = os.path.join(cg, "cgroup.procs")
        cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, "env", "OMP_NUM_THREADS=1",
               args.python, "-u", EXAMPLE, "--nproc", "2", "--port", "29678", "--iters", "20"]
        p = subprocess.Popen(cmd + flags, stdout=subprocess.PIPE, text=True)
        t0 = time.time()
        for line in p.stdout:
            if line.startswith("iter"):
                print("%.2f %s %d" % (time.time() - t0, line.split()[1], read_bytes(procs)),
                      flush=True)
        p.wait()
    finally:
        os.rmdir(cg)


if __name__ == "__main__":
    main()
