"""A data-parallel job with fully sharded parameters (FSDP2, ``fully_shard``) for showing and
testing stallscope.

Each rank holds half of every layer's parameters. Per iteration FSDP2 all-gathers each
layer's parameters before its forward (``all_gather_into_tensor``), frees them after it, gathers
them again for its backward, and reduce-scatters its gradients (``reduce_scatter_tensor``);
each rank then steps ``torch.optim`` on its own shards. It needs torch 2.x (``fully_shard`` is
``torch.distributed.fsdp.fully_shard`` from 2.6, ``torch.distributed._composable.fsdp`` before)
and runs on the CPU over gloo. ``--work-ms`` adds CPU work per layer (half in forward, half in
backward). It imports nothing from stallscope: ``stallscope run`` instruments it with no code
change.

Under stallscope:  stallscope run -- stallscope launch --nproc-per-node 2 -- python train.py
Without a launcher: python train.py --nproc 2
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

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.4 and 2.5 keep it here
    try:
        from torch.distributed._composable.fsdp import fully_shard
    except ImportError:
        fully_shard = None

FEATURES = 256  # each hidden layer: 256 x 256 weights and 256 biases, 263,168 bytes of float32
LAYERS = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=30, help="iterations (optimizer steps) per rank")
    p.add_argument("--batch", type=int, default=32, help="samples per rank and iteration")
    p.add_argument("--work-ms", type=float, default=2.0, help="CPU work per layer, ms")
    p.add_argument(
        "--no-reshard-after-forward",
        action="store_true",
        help="keep each layer's gathered parameters from forward to backward (one all-gather "
        "per layer and iteration instead of two)",
    )
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks itself")
    p.add_argument("--port", type=int, default=29550, help="rendezvous port for --nproc")
    return p.parse_args(argv)


def busy(ms):
    """Keeps this thread on the CPU for ``ms`` milliseconds: a layer's own work."""
    deadline = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < deadline:
        x += 1
    return x


class Busy(torch.autograd.Function):
    """Identity that works ``ms`` in forward and again in backward."""

    @staticmethod
    def forward(ctx, x, ms):
        ctx.ms = ms
        busy(ms)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        busy(ctx.ms)
        return grad, None


class Layer(nn.Module):
    def __init__(self, work_ms):
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)
        self.work_ms = work_ms

    def forward(self, x):
        return Busy.apply(torch.relu(self.linear(x)), self.work_ms / 2)


def model(args):
    """``LAYERS`` hidden layers, each sharded on its own, and the root over them all."""
    torch.manual_seed(args.seed)
    net = nn.Sequential(*[Layer(args.work_ms) for _ in range(LAYERS)])
    reshard = not args.no_reshard_after_forward
    for layer in net:
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(net, reshard_after_forward=reshard)
    return net


def train(args):
    if fully_shard is None:
        raise SystemExit("this example needs torch 2.x with FSDP2 (fully_shard), not torch %s"
                         % torch.__version__)
    torch.set_num_threads(1)
    # A bounded timeout: a rank that lost its peer fails in minutes, not half an hour.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    net = model(args)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed + rank)
    started = time.monotonic()
    loss = None
    for _ in range(args.iters):
        x = torch.randn(args.batch, FEATURES, generator=generator)
        loss = net(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    elapsed = time.monotonic() - started
    if rank == 0:
        params = sum(p.numel() for p in net.parameters())  # DTensors: the global count
        print("fsdp2: %d iterations in %.2f s, %d parameters sharded over %d ranks, last loss %.4f"
              % (args.iters, elapsed, params, dist.get_world_size(), float(loss.detach())))
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
