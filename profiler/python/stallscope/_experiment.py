"""What ``stallscope experiment`` asks of an unchanged training script.

Two environment variables, set by the experiment for each configuration it runs:

* ``STALLSCOPE_SYNTHETIC=1``: every DataLoader yields its first batch again and again (as
  many batches per epoch as the real one would), so the run measures the training without
  any data stall. The batch is fetched once, its loader workers are shut down, and, when the
  program already uses CUDA, it is moved to the current device once, so the program's own
  ``.to(device)`` finds it there.
* ``STALLSCOPE_MAX_ITERS=N``: the process ends after its N-th optimizer step (after a barrier
  when torch.distributed is initialised, so all ranks stop at the same iteration), with exit
  code 0 and its output flushed.

Neither is active without its variable; both are best effort and never raise into the
training: if a batch cannot be replayed, the real loader is used.
"""

import os
import sys
import weakref


def _int_env(name):
    try:
        return max(0, int(os.environ.get(name, "0")))
    except ValueError:
        return 0


synthetic = os.environ.get("STALLSCOPE_SYNTHETIC", "0") == "1"
max_iters = _int_env("STALLSCOPE_MAX_ITERS")

_steps = 0
# Batches replayed so far (the hook's iteration rule counts them as the loader's).
replayed = 0
# DataLoader → the batch it replays.
_batches = weakref.WeakKeyDictionary()


def _to_device(batch, torch):
    """The batch on the current CUDA device, when the program already uses CUDA."""
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return batch
        device = torch.device("cuda", torch.cuda.current_device())
    except Exception:
        return batch

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, (list, tuple)):
            moved = [move(v) for v in x]
            return type(x)(moved) if not hasattr(x, "_fields") else type(x)(*moved)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x

    try:
        return move(batch)
    except Exception:
        return batch


class Replay:
    """An iterator that yields one batch ``length`` times (forever when the length is unknown)."""

    __slots__ = ("batch", "left")

    def __init__(self, batch, length):
        self.batch = batch
        self.left = length

    def __iter__(self):
        return self

    def __next__(self):
        global replayed
        if self.left is not None:
            if self.left <= 0:
                raise StopIteration
            self.left -= 1
        replayed += 1
        return self.batch

    def __len__(self):
        return self.left if self.left is not None else 0


def replay(loader, real_iter, torch):
    """The replaying iterator for ``loader``, or ``None`` to use the real one."""
    try:
        batch = _batches.get(loader)
        if batch is None:
            it = real_iter(loader)
            try:
                batch = next(it)
            except StopIteration:
                return None
            finally:
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None and not getattr(loader, "persistent_workers", False):
                    shutdown()
                del it
            batch = _to_device(batch, torch)
            _batches[loader] = batch
        try:
            length = len(loader)
        except Exception:
            length = None
        return Replay(batch, length)
    except Exception:
        return None


def after_step():
    """Counts an optimizer step; ends the process at the limit."""
    global _steps
    if max_iters <= 0:
        return
    _steps += 1
    if _steps < max_iters:
        return
    _finish()


def _finish():
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.barrier()
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)
