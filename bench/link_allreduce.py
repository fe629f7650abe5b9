#!/usr/bin/env python3
"""What the advisor's network shapes' links do alone: a plain gloo all-reduce between the
two network-namespace nodes of `scripts/netns.sh` at each tbf rate, no training, no
stallscope.

The advisor finds the share of a link's nominal rate a training achieved from its profile;
this gives the share the link reaches with nothing else running (TCP over Ethernet carries
1448 payload bytes in 1538 on the wire: ~94%), and the TCP segments retransmitted, so that a
training's shortfall can be told from the link's.

    sudo python3 bench/link_allreduce.py [--rates 50,100,200,400,1000] [--reps 12]
         [--bytes 4916000]

Prints a Markdown table: per rate, the time of one all-reduce of --bytes in the advisor
benchmark's two buckets (min / median / mean / max over --reps, the first two left out),
the achieved share of the nominal rate at the median (a 2-rank ring moves the bytes once each
way), and the node's TCP retransmissions.
"""
import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(REPO, "scripts/netns.sh")

RANK = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total, reps = int(sys.argv[1]), int(sys.argv[2])
# Two buckets, as the advisor benchmark's example has (2.5 and 2.4 MB of 4.9).
first = total * 51 // 100
tensors = [torch.ones(first // 4), torch.ones((total - first) // 4)]
times = []
for _ in range(reps + 2):
    dist.barrier()
    start = time.perf_counter()
    for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
        work.wait()
    times.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    print(" ".join(f"{t:.6f}" for t in times[2:]))
dist.destroy_process_group()
"""


def retransmits(ns):
    """TcpRetransSegs of the node's network namespace (/proc/net/snmp)."""
    text = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"], check=True,
                          capture_output=True, text=True).stdout
    tcp = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("RetransSegs")])


def measure(args, rate, script):
    prefix = f"lar{os.getpid() % 10000}"
    net = str(150 + os.getpid() % 50)
    subprocess.run(["bash", NETNS, "up", prefix, f"{rate}mbit", "--net", net], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        procs = []
        for node in range(2):
            env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", RANK=str(node), WORLD_SIZE="2",
                       MASTER_ADDR=f"10.77.{net}.1", MASTER_PORT="29911")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", prefix + "ab"[node], args.python, script,
                 str(args.bytes), str(args.reps)],
                env=env, stdout=subprocess.PIPE, text=True))
        out = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{rate} Mbit/s: a rank failed")
        return sorted(float(t) for t in out[0].split()), retransmits(prefix + "a")
    finally:
        subprocess.run(["bash", NETNS, "down", prefix], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--rates", default="50,100,200,400,1000")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--bytes", type=int, default=4_916_000)
    args = ap.parse_args()
    print(f"{args.bytes / 1e6:.2f} MB per all-reduce in two buckets, 2 ranks, {args.reps} reps; "
          f"load average at start {os.getloadavg()[0]:.2f}\n")
    print("| Mbit/s | nominal (ms) | min / median / mean / max (ms) | share of nominal at the "
          "median | TCP retransmissions |")
    print("|---|---|---|---|---|")
    with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
        script.write(RANK)
        script.flush()
        for rate in (int(r) for r in args.rates.split(",")):
            times, retrans = measure(args, rate, script.name)
            nominal = args.bytes * 8 / (rate * 1e6)
            median = times[len(times) // 2]
            print(f"| {rate} | {nominal * 1e3:.0f} | {times[0] * 1e3:.0f} / {median * 1e3:.0f} / "
                  f"{sum(times) / len(times) * 1e3:.0f} / {times[-1] * 1e3:.0f} | "
                  f"{nominal / median * 100:.0f}% | {retrans} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
