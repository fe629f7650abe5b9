#!/usr/bin/env python3
"""Where the ranks' main threads spend the cold run of the accuracy matrix's fetch scenario.

Runs the example training as the fetch scenario of bench/accuracy.py runs it (2 ranks, no
loader workers, batch 8, 2,048 JPEGs on an ext4 of its own on a loop device, reads throttled
by a blkio cgroup), under `stallscope run` (for the phase markers), with the dataset evicted
from the page cache first (`--warm`: read into it first), and samples each rank's main thread
every `--interval-ms`: `/proc/PID/task/PID/{stat,schedstat,wchan,io}` (and `stack` while not
running). Each sample is put in the phase the hook marked at that moment (from `stallscope
trace`), and the table gives, per phase, ms per iteration per rank of: CPU and run-queue wait
(`schedstat`), each state letter with its wchan, and bytes read (`io` read_bytes, rchar).

    sudo python3 bench/fetch_probe.py [--warm] [--iters 15] [--interval-ms 1]
        [--stallscope target/release/stallscope] [--out DIR]
    python3 bench/fetch_probe.py --report DIR [--warm]   # the table again, from DIR

Needs root (cgroups, a loop device, `stack`). Enables per-task delay accounting
(`kernel.task_delayacct`) for the run and restores it, so `stat` field 42 (aggregated block
I/O delay, clock ticks) is counted too.
"""
import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy import LoopDisk, Throttle, make_dataset  # noqa: E402
from common import EXAMPLE, REPO  # noqa: E402

TICK_S = os.sysconf("SC_CLK_TCK")


def rank_pids(procs_file):
    """{main pid: rank} of the ranks: processes with RANK in their environment whose parent
    runs train.py under Python (the example's launcher)."""
    pids = {}
    for line in open(procs_file):
        pid = line.strip()
        try:
            env = open("/proc/{}/environ".format(pid), "rb").read().split(b"\0")
            ppid = open("/proc/{}/stat".format(pid)).read().rsplit(")", 1)[1].split()[1]
            parent = open("/proc/{}/cmdline".format(ppid), "rb").read().split(b"\0")
        except OSError:
            continue
        rank = [e[5:].decode() for e in env if e.startswith(b"RANK=")]
        if rank and b"python" in os.path.basename(parent[0]) and b"train.py" in b" ".join(parent):
            pids[int(pid)] = rank[0]
    return pids


class Thread:
    """Open files of one main thread."""

    def __init__(self, pid):
        task = "/proc/{}/task/{}/".format(pid, pid)
        self.pid = pid
        self.fds = {n: os.open(task + n, os.O_RDONLY) for n in ("stat", "schedstat", "wchan")}
        self.fds["io"] = os.open("/proc/{}/io".format(pid), os.O_RDONLY)
        self.stack = task + "stack"

    def read(self):
        r = {n: os.pread(fd, 4096, 0) for n, fd in self.fds.items()}
        stat = r["stat"].rsplit(b")", 1)[1].split()
        cpu, runq, _ = r["schedstat"].split()
        io = dict(line.split(b": ") for line in r["io"].splitlines())
        s = {
            "state": stat[0].decode(),
            "blkio_ticks": int(stat[39]),  # field 42: delayacct_blkio_ticks
            "minflt": int(stat[7]),
            "majflt": int(stat[9]),
            "on_cpu": int(stat[36]),  # field 39: the CPU it last ran on
            "cpu": int(cpu),
            "runq": int(runq),
            "wchan": r["wchan"].decode() or "0",
            "read_bytes": int(io[b"read_bytes"]),
            "rchar": int(io[b"rchar"]),
        }
        if s["state"] != "R":
            try:
                with open(self.stack) as f:
                    s["stack"] = [l.split()[1].split("+")[0] for l in f][:8]
            except (OSError, IndexError):
                pass
        return s


def cpu_ns(pids):
    """ns on the CPU of the main threads of `pids` (schedstat), those still there."""
    total = 0
    for pid in pids:
        try:
            total += int(open("/proc/{}/schedstat".format(pid)).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def process_cpu_ns(pid):
    """ns on the CPU of all threads of `pid` (stat utime + stime, clock ticks)."""
    try:
        f = open("/proc/{}/stat".format(pid)).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) * 1_000_000_000 // TICK_S
    except (OSError, ValueError, IndexError):
        return 0


def steal():
    """Per CPU, ticks the hypervisor ran something else while this CPU wanted to run."""
    return [int(l.split()[8]) for l in open("/proc/stat") if l[:3] == "cpu" and l[3] != " "]


def kernel_threads():
    """Kernel threads (children of kthreadd): the loop device's, the block layer's and
    jbd2's work runs there, not in the reader."""
    try:
        return [int(p) for p in open("/proc/2/task/2/children").read().split()]
    except OSError:
        return []


def sample(procs_file, interval, stop, out, stallscope_pid):
    threads = {}
    kthreads, n = kernel_threads(), 0
    while not stop.is_set():
        n += 1
        if n % 50 == 0:  # every ~50 ms: the CPU of what runs beside the ranks
            out.append({"t": time.monotonic_ns(), "kthreads": cpu_ns(kthreads),
                        "stallscope": process_cpu_ns(stallscope_pid), "steal": steal()})
        if len(threads) < 2:
            for pid, rank in rank_pids(procs_file).items():
                if pid not in threads:
                    try:
                        threads[pid] = Thread(pid)
                        threads[pid].rank = rank
                    except OSError:
                        pass
        for pid, t in list(threads.items()):
            try:
                s = t.read()
            except (OSError, ValueError, IndexError):
                del threads[pid]
                continue
            s["t"] = time.monotonic_ns()
            s["pid"] = pid
            s["rank"] = t.rank
            out.append(s)
        time.sleep(interval)


def phases(trace):
    """{pid: sorted [(begin_ns, end_ns, name)]} of the hook's phases, and {pid: iterations}."""
    events = json.load(open(trace))["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    spans = collections.defaultdict(list)
    iters = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        thread = names.get((e["pid"], e["tid"]), "")
        span = (int(e["ts"] * 1000), int((e["ts"] + e["dur"]) * 1000), e["name"])
        if thread.endswith(" phases"):
            spans[thread.split()[1]].append(span)
        elif thread.startswith("rank ") and len(thread.split()) == 2:
            iters[thread.split()[1]].append((span, e.get("args") or {}))
    return spans, iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/release/stallscope"))
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--fetch-bps", type=int, default=400_000)
    ap.add_argument("--warm", action="store_true", help="dataset read into the cache first")
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", metavar="DIR", help="only the table, from an earlier --out")
    args = ap.parse_args()
    if args.report:
        args.out = args.report
        samples = json.load(open(os.path.join(args.report, "samples.json")))
        return report(samples, os.path.join(args.report, "trace.json"), args)
    args.out = args.out or tempfile.mkdtemp(prefix="stallscope-fetch-probe-")
    delayacct = "/proc/sys/kernel/task_delayacct"
    before = open(delayacct).read().strip()
    disk = LoopDisk(os.path.join(args.out, "disk"))
    throttle = None
    try:
        open(delayacct, "w").write("1")
        big = make_dataset(args.python, disk.mount, 2048, 64)
        throttle = Throttle(big, args.fetch_bps)
        os.sync()  # dirty pages (the dataset was just written) are not evicted
        for name in os.listdir(big):
            fd = os.open(os.path.join(big, name), os.O_RDONLY)
            if args.warm:
                os.read(fd, 1 << 20)
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        resident = subprocess.run("fincore -nb -o RES " + os.path.join(big, "*") + " | awk '{s+=$1} END {print s}'",
                                  shell=True, capture_output=True, text=True).stdout.strip()
        print("dataset bytes resident before the run: " + resident, flush=True)
        profile = os.path.join(args.out, "run.stallscope")
        cmd = [args.stallscope, "run", "-q", "-o", profile, "--", args.python, EXAMPLE,
               "--nproc", "2", "--iters", str(args.iters), "--workers", "0", "--batch", "8",
               "--data-dir", disk.mount, "--images", "2048", "--port", "29691"]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        samples, stop = [], threading.Event()
        proc = subprocess.Popen(throttle.wrap(cmd), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs = os.path.join(throttle.dir, "cgroup.procs")
        # sh execs stallscope: its pid is the run's (agent included).
        sampler = threading.Thread(target=sample, args=(
            procs, args.interval_ms / 1000, stop, samples, proc.pid))
        sampler.start()
        log = proc.communicate()[0]
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            sys.exit("run failed:\n" + log[-3000:])
    finally:
        open(delayacct, "w").write(before)
        if throttle:
            throttle.close()
        disk.close()
    trace = os.path.join(args.out, "trace.json")
    subprocess.run([args.stallscope, "trace", profile, "-o", trace], check=True,
                   capture_output=True)
    with open(os.path.join(args.out, "samples.json"), "w") as f:
        json.dump(samples, f)
    report(samples, trace, args)


def label(sp, begins, t):
    """The phase that decides time `t` in the attribution: comm over data over compute."""
    found = set()
    k = bisect.bisect_right(begins, t) - 1
    while k >= 0 and k >= bisect.bisect_right(begins, t) - 64:
        if sp[k][0] <= t < sp[k][1]:
            found.add(sp[k][2])
        k -= 1
    for ph in ("comm", "data", "compute"):
        if ph in found:
            return ph
    return "unmarked"


def report(samples, trace, args):
    spans, iters = phases(trace)
    by_rank = collections.defaultdict(list)
    beside = []
    for s in samples:
        if "rank" in s:
            by_rank[s["rank"]].append(s)
        else:
            beside.append(s)
    table = collections.defaultdict(float)  # (phase, what) -> ms, kB or count
    n_iters = 0
    online = collections.defaultdict(float)
    for rank, ss in sorted(by_rank.items()):
        sp = sorted(spans.get(rank, []))
        begins = [s[0] for s in sp]
        its = sorted(iters.get(rank, []))[3:]  # warm-up, as the experiment's
        for _, args_ in its:
            for k, v in args_.items():
                if k.endswith("_ms"):
                    online[k] += v
        its = [s for s, _ in its]
        if not its:
            continue
        lo, hi = its[0][0], its[-1][1]
        n_iters += len(its)
        for a, b in zip(ss, ss[1:]):
            if a["t"] < lo or b["t"] > hi:
                continue
            ph = label(sp, begins, a["t"])
            ms = 1e-6
            table[(ph, "wall")] += (b["t"] - a["t"]) * ms
            table[(ph, "cpu (schedstat)")] += (b["cpu"] - a["cpu"]) * ms
            table[(ph, "run queue (schedstat)")] += (b["runq"] - a["runq"]) * ms
            table[(ph, "blkio delay (stat 42)")] += (b["blkio_ticks"] - a["blkio_ticks"]) * 1e3 / TICK_S
            table[(ph, "kB read_bytes")] += (b["read_bytes"] - a["read_bytes"]) / 1024
            table[(ph, "kB rchar")] += (b["rchar"] - a["rchar"]) / 1024
            table[(ph, "major faults")] += b["majflt"] - a["majflt"]
            where = a["state"] + (" " + a["wchan"] if a["state"] != "R" else "")
            if a["state"] != "R" and a.get("stack"):
                where += " [" + " < ".join(a["stack"][:4]) + "]"
            table[(ph, "state " + where)] += (b["t"] - a["t"]) * ms
    window = [s for s in beside if lo <= s["t"] <= hi]
    if len(window) >= 2 and its:
        per_iter = len(its)  # the last rank's iterations span the window
        for k in ("kthreads", "stallscope"):
            table[("beside", "cpu of " + k)] += (window[-1][k] - window[0][k]) * 1e-6 * n_iters / per_iter
    print("{} iterations counted (both ranks, after 3 warm-up each); {} samples; {}".format(
        n_iters, len(samples), "warm" if args.warm else "cold"))
    print("online, ms per iteration per rank: " + ", ".join(
        "{} {:.1f}".format(k[:-3], v / max(n_iters, 1)) for k, v in sorted(online.items())))
    print("| phase | what | per iteration per rank (ms, kB, count) |")
    print("|---|---|---:|")
    for (ph, what), v in sorted(table.items(), key=lambda kv: (kv[0][0], -kv[1])):
        per = v / max(n_iters, 1)
        if per >= 0.2 or not what.startswith("state"):
            print("| {} | {} | {:.1f} |".format(ph, what, per))
    print("(samples and trace in {})".format(args.out))


if __name__ == "__main__":
    main()
