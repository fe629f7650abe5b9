"""A real data-parallel training job for showing and testing stallscope.

It trains a small ResNet-style CNN on JPEG files it decodes and augments on the fly, with
DistributedDataParallel (gloo on CPU, NCCL on GPU), so every stall stallscope attributes is a
real one: loader workers decoding images (``--data-delay-ms`` adds CPU work per sample, for all
ranks or chosen ones, to make data preparation the bottleneck), gradient all-reduce, and ranks
waiting for a slower peer. It imports nothing from stallscope: ``stallscope run`` instruments it
with no code change.

Single process:  python3 train.py --iters 20
Distributed:     torchrun --nproc_per_node 2 train.py --data-delay-ms 1:50
"""

import argparse
import concurrent.futures
import datetime
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

CLASSES = 10


def parse_args(argv=None):
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=60, help="iterations per rank")
    p.add_argument("--batch", type=int, default=16, help="batch size per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--images", type=int, default=512, help="images in the generated data set")
    p.add_argument("--image-size", type=int, default=64, help="side of the generated images")
    p.add_argument(
        "--data-dir",
        default=os.path.join(cache, "stallscope", "example-data"),
        help="where the generated images are kept and reused",
    )
    p.add_argument(
        "--data-url",
        default=None,
        help="read the data set over HTTP instead: a directory listing of JPEGs (as "
        "`python3 -m http.server` serves one), each sample fetched with urllib",
    )
    p.add_argument(
        "--data-delay-ms",
        default="0",
        help="CPU work per sample: MS for every rank, or RANK:MS,... for chosen ranks",
    )
    p.add_argument(
        "--slow-from",
        default=None,
        metavar="ITER:RANK:KIND:MS",
        help="from iteration ITER on, rank RANK turns slow: KIND data adds MS of CPU work per "
        "sample in the loader, compute MS of CPU work to each step",
    )
    p.add_argument(
        "--data-on-thread",
        action="store_true",
        help="do each sample's CPU work on a helper thread of the loader worker, as decoders with "
        "thread pools do (the worker's main thread waits asleep)",
    )
    p.add_argument(
        "--comm-hook",
        default="none",
        choices=["none", "fp16"],
        help="DDP communication hook: fp16 compresses the gradients to half their bytes",
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU default: 1)")
    p.add_argument("--exit-code", type=int, default=0, help="exit status after training")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="start this many local ranks (like torchrun --nproc_per_node) when not already in one",
    )
    p.add_argument("--port", type=int, default=29500, help="rendezvous port for --nproc")
    return p.parse_args(argv)


def delay_for_rank(spec, rank):
    """Milliseconds of work per sample for ``rank``, from ``MS`` or ``RANK:MS,...``."""
    delay = 0.0
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if ":" in item:
            who, ms = item.split(":", 1)
            if int(who) == rank:
                return float(ms)
        else:
            delay = float(item)
    return delay


def parse_slow_from(spec, rank):
    """``(iteration, kind, ms)`` when ``--slow-from ITER:RANK:KIND:MS`` slows ``rank``, else
    None."""
    if not spec:
        return None
    it, who, kind, ms = spec.split(":")
    if kind not in ("data", "compute"):
        sys.exit("--slow-from: KIND is data or compute, not {!r}".format(kind))
    if int(who) != rank:
        return None
    return int(it), kind, float(ms)


class NumberedSampler(torch.utils.data.Sampler):
    """Yields ``(index, batch number in the training)`` for each index of ``inner``, so a
    loader worker knows which iteration the sample is for (``--slow-from``). ``first_batch``
    is set before each epoch to the iterations done so far."""

    def __init__(self, inner, batch):
        self.inner = inner
        self.batch = batch
        self.first_batch = 0

    def __iter__(self):
        for k, index in enumerate(self.inner):
            yield index, self.first_batch + k // self.batch

    def __len__(self):
        return len(self.inner)


def busy_work(ms):
    """Burns ``ms`` milliseconds of this thread's CPU time, like a costly transform would."""
    deadline = time.thread_time() + ms / 1000.0
    x = 1.0001
    while time.thread_time() < deadline:
        for _ in range(200):
            x = x * 1.0000001 + 1e-9
    return x


# --- data ---------------------------------------------------------------------------------


def synthetic_image(label, size, rng):
    """An image whose class shows in stripe orientation and colour, under noise."""
    angle = math.pi * label / CLASSES
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    phase = rng.uniform(0, 2 * math.pi)
    stripes = np.sin((xs * math.cos(angle) + ys * math.sin(angle)) * 0.5 + phase)
    hue = np.array(
        [math.sin(label), math.sin(label + 2.1), math.sin(label + 4.2)], dtype=np.float32
    )
    rgb = 128 + 60 * stripes[..., None] * hue + rng.normal(0, 25, (size, size, 3))
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def ensure_dataset(root, images, size, seed):
    """Returns the folder of generated JPEGs, generating it once.

    Ranks starting together may all generate; each writes into its own temporary folder and
    renames it into place, so a reader only ever sees a complete set.
    """
    final = os.path.join(root, "n{}-s{}".format(images, size))
    if os.path.isdir(final):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".partial-", dir=root)
    try:
        rng = np.random.default_rng(seed)
        for i in range(images):
            label = i % CLASSES
            path = os.path.join(tmp, "c{}_{:06d}.jpg".format(label, i))
            synthetic_image(label, size, rng).save(path, quality=90)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):  # not a lost race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch(url):
    """The body of one HTTP GET (a new connection each time, as urllib makes them)."""
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def list_remote(url):
    """The JPEGs an HTTP directory listing names, sorted."""
    listing = fetch(url + "/").decode("utf-8", "replace")
    return sorted(set(re.findall(r'href="([^"/]+\.jpg)"', listing)))


class JpegFolder(Dataset):
    """Labelled JPEGs, decoded with PIL and augmented on each access."""

    def __init__(self, folder, size, delay_ms, on_thread=False, slow_from=None, url=None):
        self.slow_from = slow_from
        self.url = url.rstrip("/") if url else None
        if self.url:
            self.files = list_remote(self.url)
        else:
            self.files = sorted(f for f in os.listdir(folder) if f.endswith(".jpg"))
        self.folder = folder
        self.delay_ms = delay_ms
        self.on_thread = on_thread
        self.transform = transforms.Compose(
            [
                transforms.RandomCrop(size, padding=size // 8),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
            ]
        )

    def __len__(self):
        return len(self.files)

    def pool(self):
        """This process's helper thread (one per loader worker, made on first use)."""
        if getattr(self, "_pool_pid", None) != os.getpid():
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
            self._pool_pid = os.getpid()
        return self._pool

    def __getitem__(self, index):
        delay_ms = self.delay_ms
        if isinstance(index, tuple):
            index, batch_number = index
            it, _, ms = self.slow_from
            if batch_number >= it:
                delay_ms += ms
        name = self.files[index]
        if self.url:
            source = io.BytesIO(fetch(self.url + "/" + name))
        else:
            source = os.path.join(self.folder, name)
        with Image.open(source) as image:
            x = self.transform(image.convert("RGB"))
        if delay_ms > 0:
            if self.on_thread:
                self.pool().submit(busy_work, delay_ms).result()
            else:
                busy_work(delay_ms)
        return x, int(name[1 : name.index("_")])


# --- model --------------------------------------------------------------------------------


class Block(nn.Module):
    """A basic residual block."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.stages = nn.Sequential(
            Block(width, width, 1),
            Block(width, 2 * width, 2),
            Block(2 * width, 4 * width, 2),
            Block(4 * width, 8 * width, 2),
        )
        self.head = nn.Linear(8 * width, CLASSES)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- training -----------------------------------------------------------------------------


def setup_distributed(backend):
    """Joins the torchrun job if there is one; returns (rank, world_size, device)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return 0, 1, device
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    # A bounded timeout: a rank that lost its peers fails in minutes, not half an hour.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    return dist.get_rank(), dist.get_world_size(), device


def launch_local_ranks(args, argv):
    """Starts --nproc ranks of this script with the environment torchrun would give them
    (Debian's torchrun for torch 1.13 fails on Python 3.11), waits, and returns the first
    failing exit code, or 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    procs = []
    for rank in range(args.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def main(argv=None):
    args = parse_args(argv)
    if args.nproc > 1 and "RANK" not in os.environ:
        sys.exit(launch_local_ranks(args, argv))
    rank, world, device = setup_distributed(args.backend)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    if args.data_url:
        folder = None
    else:
        folder = ensure_dataset(args.data_dir, args.images, args.image_size, args.seed)
    slow = parse_slow_from(args.slow_from, rank)
    data_slow = slow if slow is not None and slow[1] == "data" else None
    dataset = JpegFolder(
        folder,
        args.image_size,
        delay_for_rank(args.data_delay_ms, rank),
        args.data_on_thread,
        slow_from=data_slow,
        url=args.data_url,
    )
    sampler = DistributedSampler(dataset, seed=args.seed) if world > 1 else None
    numbered = None
    if data_slow is not None:
        inner = sampler if sampler is not None else torch.utils.data.RandomSampler(dataset)
        numbered = NumberedSampler(inner, args.batch)
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=sampler is None and numbered is None,
        sampler=numbered if numbered is not None else sampler,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=args.workers > 0,
    )
    if len(loader) == 0:
        sys.exit("--images {} gives no full batch of {} per rank".format(args.images, args.batch))

    model = ResNet(args.width).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        if args.comm_hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    done, epoch = 0, 0
    last = time.perf_counter()
    while done < args.iters:
        if sampler is not None:
            sampler.set_epoch(epoch)
        if numbered is not None:
            numbered.first_batch = done
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            if slow is not None and slow[1] == "compute" and done >= slow[0]:
                busy_work(slow[2])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if rank == 0:
                value = loss.item()
                now = time.perf_counter()
                print(
                    "iter {} loss {:.4f} time_ms {:.1f}".format(done, value, (now - last) * 1e3),
                    flush=True,
                )
                last = now
            done += 1
            if done == args.iters:
                break
        epoch += 1

    if world > 1:
        dist.barrier()  # leave together: no rank tears down while a peer still talks to it
        dist.destroy_process_group()
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
