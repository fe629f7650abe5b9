"""Keeps stallscope's DDP comm hook from hanging a job when its process group goes away.

Why this exists: to see when each gradient bucket becomes ready, stallscope relays DDP's
all-reduce through a Python comm hook. With gloo, a bucket's all-reduce completes on one of the
process group's worker threads, and that thread then takes the GIL twice: to run and release
the hook's completion callback (Python), and, when it drops the finished work, to free the
bucket tensor's Python object if the work held its last reference. Destroying a
``ProcessGroupGloo`` joins those threads while holding the GIL: in ``destroy_process_group()``,
or when the DDP module holding the group's last reference is freed (``del model``, or at
exit). A worker thread still waiting for the GIL then never ends, and neither does the
training. PyTorch has this race for any Python comm hook: with torch 1.13, two ranks that run
``destroy_process_group()`` and then ``del model`` right after their last backward hung in 2
of 20 processes with ``default_hooks.allreduce_hook`` registered, and in none of 10 without a
hook. A job that chose no hook must not get the race from stallscope, so:

* the completion callbacks of stallscope's own all-reduce hooks count themselves alive until
  the thread that ran them releases them; before a process group can be destroyed
  (``destroy_process_group()``, interpreter exit) the main thread waits, sleeping with the GIL
  free, until none is left — at most ``PATIENCE_S``, normally not at all;
* the tensors and futures of the latest backward's buckets stay referenced from here, so that
  a worker thread never drops the last reference to one (a future's value is a Python object
  too: the callback's result); at exit they are kept for good (the process's end frees them);
* once no counted callback is left, ``destroy_process_group()`` still waits ``SETTLE_S``
  more, the GIL free. With the two guards above, 2 of about 670 such processes still hung
  (torch 1.13): every counted callback had run and been released before
  ``destroy_process_group()``, yet at ``del model`` a worker thread, finishing a work, waited
  for the GIL while the main thread joined it (gdb's stacks; which work, its frames do not
  say). The pause gives such a thread the GIL before the group can go. Keeping the group
  referenced past ``del model`` instead was tried and is wrong: a group alive when its peer
  exits aborts the process (gloo, on the closed connection), as a rank that exited with
  SIGABRT in CI showed.
"""

import atexit
import os
import time

# Longest wait, s, for communication threads to release the callbacks they ran.
PATIENCE_S = 2.0

# ids of the counted completion callbacks not yet released (set.add/discard are atomic under
# the GIL, whichever thread releases).
_alive = set()
# The tensors and futures of the latest backward's communication (the buckets' own tensors or
# their compressed copies, and the futures the hooks returned).
_kept = []
# At most this many kept (two per bucket: its tensor and its future).
MAX_KEPT = 1024
_exit_guarded = False
# s the GIL is left free once no counted callback is left, before a group may be destroyed.
SETTLE_S = 0.05


class Counted:
    """A completion callback, counted alive until whichever thread runs it releases it."""

    __slots__ = ("_fn", "__weakref__")

    def __init__(self, fn):
        self._fn = fn
        _alive.add(id(self))

    def __call__(self, fut):
        return self._fn(fut)

    def __del__(self):
        try:
            _alive.discard(id(self))
        except Exception:  # interpreter teardown
            pass


def _first_tensor(fut):
    return fut.value()[0]


def allreduce_hook(process_group, bucket):
    """DDP's default communication, as ``default_hooks.allreduce_hook`` does it (the bucket's
    gradients summed over the group, then divided by its size) with a counted callback."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()  # kept by the relay
    tensor.div_(group.size())
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(Counted(_first_tensor))


def fp16_compress_hook(process_group, bucket):
    """``default_hooks.fp16_compress_hook`` (the built-in FP16_COMPRESS), counted and kept."""
    import torch
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.float16).div_(group.size())
    keep(compressed)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        out = bucket.buffer()
        out.copy_(fut.value()[0])  # in place: no second full-size buffer
        return out

    return fut.then(Counted(decompress))


def keep(obj):
    """Keeps ``obj`` (a tensor or future of this backward's communication) referenced here.

    A loop whose backward passes stallscope does not see (``torch.autograd.grad``) never calls
    ``new_backward``: past ``MAX_KEPT`` the older half goes, long finished by then.
    """
    if len(_kept) >= MAX_KEPT:
        del _kept[: MAX_KEPT // 2]
    _kept.append(obj)


def new_backward():
    """A backward begins: the previous one's communication is over, its tensors may go."""
    del _kept[:]


def wait_for_release(patience_s=PATIENCE_S):
    """Waits, sleeping (the GIL free), until every counted callback has been released by the
    thread that ran it; at most ``patience_s``. Returns whether none is left."""
    deadline = time.monotonic() + patience_s
    while _alive and time.monotonic() < deadline:
        time.sleep(0.001)
    return not _alive


def settle():
    """Before a process group of a relayed module is destroyed: ``SETTLE_S`` with the GIL
    free, for a communication thread still finishing a work (see the module's docs). Nothing
    when no DDP module was relayed."""
    if _exit_guarded:
        time.sleep(SETTLE_S)


def _at_exit():
    wait_for_release()
    try:
        import ctypes

        # One reference that nothing drops: the tensors outlive every process group.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))
    except Exception:
        pass


def guard_exit():
    """Registers the exit guard once (when a DDP module is first relayed)."""
    global _exit_guarded
    if _exit_guarded:
        return
    _exit_guarded = True
    atexit.register(_at_exit)


# A forked child has none of the parent's communication threads, nor their callbacks.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_alive.clear)
