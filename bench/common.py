"""What the benchmarks share: where things are, the two binaries they compare, and the generated
data set of the example training (made once, so no run pays for generating it)."""
import os
import statistics
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples/pytorch_ddp/train.py")
DATA = os.path.join(tempfile.gettempdir(), "stallscope-bench-data")


def add_binary_args(ap):
    """``--python`` (an interpreter with torch) and ``--stallscope`` (the release build)."""
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/release/stallscope"))


def prepare_data(python):
    """Generates the example's data set in ``DATA`` with a one-iteration run."""
    subprocess.run([python, EXAMPLE, "--iters", "1", "--workers", "0", "--data-dir", DATA],
                   check=True, stdout=subprocess.DEVNULL)


def block_device_of(path):
    """MAJ:MIN of the whole disk holding ``path`` (blkio throttles whole devices)."""
    dev = os.stat(path).st_dev
    sys_path = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.path.exists(os.path.join(sys_path, "partition")):
        with open(os.path.join(os.path.dirname(sys_path), "dev")) as f:
            return f.read().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


def overhead_job(python, iters, port):
    """The overhead benchmarks' job: the example DDP training, 2 ranks, 2 DataLoader workers
    each, on the generated data set, rendezvous on `port`."""
    return [python, EXAMPLE, "--nproc", "2", "--workers", "2", "--iters", str(iters),
            "--data-dir", DATA, "--port", str(port)]


def launch_job(python, iters, port, launcher, example_args):
    """The issue-31 job: `stallscope launch` of 2 ranks with 2 loader workers each."""
    return [launcher, "launch", "--nproc-per-node", "2", "--master-port", str(port), "--",
            python, EXAMPLE, "--workers", "2", "--iters", str(iters), "--data-dir", DATA
            ] + example_args


def add_ab_args(ap, repeats):
    """``--a`` and ``--b`` (two stallscope binaries, alternated), ``--a-env`` / ``--b-env``
    (KEY=VALUE for each one's runs) and ``--repeats``."""
    ap.add_argument("--a", required=True, help="a stallscope binary")
    ap.add_argument("--b", help="another stallscope binary, alternated with --a")
    ap.add_argument("--a-env", action="append", help="KEY=VALUE for --a's runs")
    ap.add_argument("--b-env", action="append", help="KEY=VALUE for --b's runs")
    ap.add_argument("--repeats", type=int, default=repeats)


def run_alternated(args, one_run, keys):
    """Runs ``one_run(binary, env)`` (a dict of figures) ``args.repeats`` times per build,
    alternating the builds' order each repeat; prints each run's ``keys`` with the load average
    (1 min), then per build each key's min / median / max."""
    def env_of(pairs):
        return dict(p.split("=", 1) for p in pairs or [])

    builds = [("a", args.a, env_of(args.a_env))]
    if args.b:
        builds.append(("b", args.b, env_of(args.b_env)))
    results = {name: [] for name, _, _ in builds}
    for repeat in range(args.repeats):
        order = builds if repeat % 2 == 0 else builds[::-1]
        for name, binary, env in order:
            load = os.getloadavg()[0]
            figures = one_run(binary, env)
            results[name].append(figures)
            shown = " ".join(f"{k}={figures[k]:.3f}" for k in keys)
            print(f"{name} run {repeat + 1}: {shown} (load {load:.2f})", flush=True)
    for name, binary, env in builds:
        print(f"{name}: {binary} {env or ''}")
        for k in keys:
            xs = [r[k] for r in results[name]]
            print(f"  {k:9} min {min(xs):.3f}  median {statistics.median(xs):.3f}  "
                  f"max {max(xs):.3f}")
