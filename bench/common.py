"""What the benchmarks share: where things are, the two binaries they compare, and the generated
data set of the example training (made once, so no run pays for generating it)."""
import os
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
