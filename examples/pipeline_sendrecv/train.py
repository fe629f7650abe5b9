"""A two-stage pipeline-parallel training job (GPipe order) for showing and testing stallscope.

Each rank holds one stage of a small MLP. Per iteration, stage 0 sends the activations of
``--micro-batches`` micro-batches to stage 1 with ``dist.send``, stage 1 runs them and sends
the gradients back with ``dist.send``, in reverse order; each stage then steps its own
``torch.optim`` optimizer. ``--stage-work-ms A,B`` adds CPU work per micro-batch to each
stage (half in forward, half in backward), so an imbalanced pipeline is a real one: the
lighter stage waits in ``recv`` for the heavier one. It imports nothing from stallscope:
``stallscope run`` instruments it with no code change.

Under stallscope:  stallscope run -- stallscope launch --nproc-per-node 2 -- \\
                       python3 train.py --stage-work-ms 5,15
Without a launcher: python3 train.py --nproc 2 --stage-work-ms 5,15
"""

import argparse
import datetime
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

FEATURES = 128  # one micro-batch of 32 samples is 16 kB of float32 activations


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=30, help="iterations (optimizer steps) per rank")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per iteration")
    p.add_argument("--micro-batch", type=int, default=32, help="samples per micro-batch")
    p.add_argument(
        "--stage-work-ms",
        default="5,15",
        help="CPU work per micro-batch of each stage, ms, comma-separated (stage 0 first)",
    )
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks itself")
    p.add_argument("--port", type=int, default=29540, help="rendezvous port for --nproc")
    return p.parse_args(argv)


def busy(ms):
    """Keeps this thread on the CPU for ``ms`` milliseconds: a stage's own work."""
    deadline = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < deadline:
        x += 1
    return x


def stage_module(stage):
    torch.manual_seed(stage)
    if stage == 0:
        return nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU())
    return nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU(), nn.Linear(FEATURES, 1))


def first_stage(args, model, optimizer, work_ms, generator):
    """Stage 0: forward every micro-batch and send it on, then take each gradient back."""
    outputs = []
    for _ in range(args.micro_batches):
        x = torch.randn(args.micro_batch, FEATURES, generator=generator)
        h = model(x)
        busy(work_ms / 2)
        dist.send(h.detach().contiguous(), dst=1)
        outputs.append(h)
    grad = torch.empty(args.micro_batch, FEATURES)
    for h in reversed(outputs):
        dist.recv(grad, src=1)
        h.backward(grad)
        busy(work_ms / 2)
    optimizer.step()
    optimizer.zero_grad()


def last_stage(args, model, optimizer, work_ms):
    """Stage 1: receive every micro-batch and run it, then send each input's gradient back."""
    inputs, losses = [], []
    for _ in range(args.micro_batches):
        h = torch.empty(args.micro_batch, FEATURES)
        dist.recv(h, src=0)
        h.requires_grad_(True)
        losses.append(model(h).pow(2).mean())
        busy(work_ms / 2)
        inputs.append(h)
    for h, loss in zip(reversed(inputs), reversed(losses)):
        loss.backward()
        busy(work_ms / 2)
        dist.send(h.grad.contiguous(), dst=0)
    optimizer.step()
    optimizer.zero_grad()
    return float(losses[-1])


def train(args):
    torch.set_num_threads(1)
    # A bounded timeout: a rank that lost its peer fails in minutes, not half an hour.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("this pipeline has two stages: run it with 2 ranks, not %d" % world)
    work = [float(ms) for ms in args.stage_work_ms.split(",")]
    if len(work) != 2:
        raise SystemExit("--stage-work-ms takes two values, one per stage")
    model = stage_module(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.monotonic()
    loss = None
    for _ in range(args.iters):
        if rank == 0:
            first_stage(args, model, optimizer, work[0], generator)
        else:
            loss = last_stage(args, model, optimizer, work[1])
    dist.barrier()
    elapsed = time.monotonic() - started
    if rank == 1:
        print("pipeline: %d iterations in %.2f s, last loss %.4f" % (args.iters, elapsed, loss))
    dist.destroy_process_group()


def launch_local_ranks(args, argv):
    """Starts --nproc ranks of this script with the environment torchrun would give them,
    waits, and returns the first failing exit code, or 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    procs = []
    for rank in range(args.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(args.port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def main(argv=None):
    args = parse_args(argv)
    if args.nproc and "RANK" not in os.environ:
        return launch_local_ranks(args, argv)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
