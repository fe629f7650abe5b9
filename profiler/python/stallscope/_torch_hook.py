"""Zero-code instrumentation of PyTorch training loops.

``sitecustomize`` calls ``install()`` as soon as ``torch`` has been imported, so an unchanged
training script sends the markers stallscope attributes iterations with:

* ``data``: the loop waits in ``DataLoader.__iter__`` / ``__next__`` for the next batch;
* ``S``: the optimizer's ``step()`` returned, which is where an iteration ends — at most once
  per backward pass and per batch: a second optimizer stepping on the same gradients (Muon
  with AdamW) or a second model's step on the same batch (a GAN's generator after its
  discriminator) ends no iteration; a step AMP's ``GradScaler`` skipped (inf or NaN
  gradients) still does, when ``scaler.step()`` returns; gradient accumulation (several
  backward passes, under DDP's ``no_sync``, per optimizer step) is one iteration per step;
* ``comm``: the *exposed* part of DDP's gradient all-reduce, from the moment the last gradient
  bucket became ready until ``backward()`` returns (all-reduce overlapped with the rest of the
  backward pass cost no wall time and is compute), and DDP's blocking buffer broadcast at the
  start of ``forward()``, where rank 0 waits for late peers;
* ``comm`` with ``op=``: every ``torch.distributed`` collective and send/receive the program
  calls itself, with its identity (``_dist_ops``);
* ``M``: facts the analysis needs (framework, world size, loader workers, loader processes),
  and where this process dumps its Python stacks on request (``_stacks``).

Everything here is best effort: a patch that does not apply to the installed torch is skipped,
and a patched function behaves exactly like the original apart from the markers (its result and
its exceptions are passed through unchanged). Works with torch 1.13 and 2.x.
"""

import functools
import inspect
import os
import sys
import threading
import time
import weakref

import stallscope
from stallscope import _comm_release, _cuda_timing, _dist_ops, _experiment, _stacks

_monotonic_ns = time.monotonic_ns
_installed = False
_step_guard = threading.local()
# CLOCK_MONOTONIC ns at which a DDP gradient bucket last became ready, in any DDP module.
_last_bucket_ns = -1
# Bytes and count of the DDP gradient buckets of the current backward (any DDP module), and
# the pair last sent as meta `comm_bytes`/`comm_buckets`: the advisor tells latency-bound
# from bandwidth-bound communication by them. Sent only when they change.
_bucket_bytes = 0
_bucket_count = 0
_comm_sent = None
# The buckets' sizes in the order they became ready (the last layers' first), sent with the
# pair as `comm_bucket_kb` (kB, `:`-separated, at most _MAX_BUCKET_SIZES): P3-style
# prioritisation sends the last one first, as the next forward needs it first.
_bucket_sizes = []
_MAX_BUCKET_SIZES = 32
# CLOCK_MONOTONIC ns at which the first bucket of the current backward became ready, and the
# recent spans first-to-last bucket ready (communication overlapped with backward compute):
# their median goes out as meta `comm_overlap_us` every 16 backwards.
_first_bucket_ns = -1
_overlaps = []
# Each bucket's ready time in the current backward, ns after the first (ready order, at most
# _MAX_BUCKET_SIZES), and those of the recent backwards: per bucket, their median goes out
# with `comm_overlap_us` as `comm_bucket_ready_ms` (ms to 0.1, `:`-separated). The advisor
# replays the buckets through a link in this order: one that waits for backward leaves it idle.
_bucket_ready = []
_readies = []
# True while an outermost backward() runs; reentrant backward (checkpointing) runs on other
# threads too, so this is process-wide rather than thread-local.
_in_backward = False
# What the iteration-end rule (_ends_iteration) reads: backward passes and DataLoader batches
# since the last iteration ended, whether any backward was ever seen, whether the last
# iteration had a batch, steps refused in a row, and iteration ends so far.
_backwards = 0
_backward_seen = False
_batches = 0
_last_had_batch = False
_refused = 0
_ends = 0
# Batches the experiment's synthetic loader had replayed when the last iteration ended.
_replayed_at_end = 0
# Steps refused in a row after which the rule gives way: a loop that trains without
# autograd.backward (torch.autograd.grad) or without the loader it once used.
_MAX_REFUSED = 8


def install():
    """Patches the imported torch; idempotent, never raises."""
    global _installed
    if _installed or os.environ.get("STALLSCOPE_AUTO", "1") == "0" or not stallscope.enabled():
        return
    _installed = True
    try:
        import torch
    except Exception:
        return
    for patch in (
        _patch_dataloader,
        _patch_worker_loop,
        _patch_optimizer,
        _patch_grad_scaler,
        _patch_ddp,
        _patch_backward,
        _patch_init_process_group,
        _dist_ops.install,
    ):
        try:
            patch(torch)
        except Exception:
            pass
    try:
        stallscope.meta(
            framework="torch-" + str(torch.__version__).replace("+", "-"),
            pid=os.getpid(),
            role=_role(),
            rank=stallscope._rank,
        )
    except Exception:
        pass
    _stacks.install()  # after the framework meta, which a reader takes as the first


def _role():
    """``launcher`` for torchrun's agent process, which trains nothing; else ``trainer``."""
    if sys.argv and os.path.basename(str(sys.argv[0])).startswith("torchrun"):
        return "launcher"
    argv = getattr(sys, "orig_argv", None) or []  # with -m, sys.argv[0] is still "-m" here
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return "launcher"
    return "trainer"


def _marked(fn):
    return getattr(fn, "_stallscope", False)


def _mark(wrapper):
    wrapper._stallscope = True
    return wrapper


# --- DataLoader ---------------------------------------------------------------------------

_loader_configs = set()


def _patch_dataloader(torch):
    dataloader = torch.utils.data.dataloader
    loader_cls = dataloader.DataLoader
    iter_cls = dataloader._BaseDataLoaderIter
    data = stallscope.phase("data")

    # Starting an iterator may start worker processes and wait for them: the loop waits for
    # data all the same.
    loader_iter = loader_cls.__iter__
    if not _marked(loader_iter):

        @functools.wraps(loader_iter)
        def __iter__(self):
            _cuda_timing.on_data_begin()
            try:
                with data:
                    if _experiment.synthetic:
                        replay = _experiment.replay(self, loader_iter, torch)
                        if replay is not None:
                            return replay
                    return loader_iter(self)
            finally:
                _cuda_timing.on_data_end()

        loader_cls.__iter__ = _mark(__iter__)

    iter_init = iter_cls.__init__
    if not _marked(iter_init):

        @functools.wraps(iter_init)
        def __init__(self, *args, **kwargs):
            iter_init(self, *args, **kwargs)
            _loader_meta(args[0] if args else kwargs.get("loader"))

        iter_cls.__init__ = _mark(__init__)

    iter_next = iter_cls.__next__
    if not _marked(iter_next):

        @functools.wraps(iter_next)
        def __next__(self):
            _cuda_timing.on_data_begin()
            try:
                stallscope.begin("data", waits_for=_awaited_worker(self))
                try:
                    batch = iter_next(self)
                finally:
                    stallscope.end("data")
            finally:
                _cuda_timing.on_data_end()
            global _batches
            _batches += 1
            if not getattr(self, "_stallscope_sized", False):
                _batch_meta(self, batch, torch)
            return batch

        iter_cls.__next__ = _mark(__next__)


def _awaited_worker(loader_iter):
    """The pid of the worker whose batch ``__next__`` is about to wait for, or None.

    A multi-process iterator hands batch ``_rcvd_idx`` out next; ``_task_info`` maps it to
    ``(worker_id,)`` while the batch is still being made (to ``(worker_id, data)`` once it came
    in early), so the loop waits for that worker. Single-process iterators have neither.
    """
    try:
        task = loader_iter._task_info.get(loader_iter._rcvd_idx)
        if task is not None and len(task) == 1:
            return loader_iter._workers[task[0]].pid
    except Exception:
        pass
    return None


def _batch_meta(loader_iter, batch, torch):
    """Sends ``batch_bytes`` of an iterator's first batch (to compare with the PCIe bytes the
    GPU receives per iteration), once per iterator."""
    try:
        loader_iter._stallscope_sized = True
        stallscope.meta(batch_bytes=_tensor_bytes(batch, torch, depth=4))
    except Exception:
        pass


def _tensor_bytes(obj, torch, depth):
    """Bytes of the tensors in ``obj`` (nested tuples, lists and dicts, ``depth`` levels)."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if depth <= 0:
        return 0
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(x, torch, depth - 1) for x in obj[:1024])
    return 0


def _loader_meta(loader):
    """Sends the loader's configuration, once per distinct configuration."""
    try:
        try:
            samples = len(loader.dataset)
        except Exception:
            samples = None
        config = (
            int(getattr(loader, "num_workers", 0) or 0),
            getattr(loader, "batch_size", None),
            int(bool(getattr(loader, "pin_memory", False))),
            samples,
        )
        if config not in _loader_configs:
            _loader_configs.add(config)
            stallscope.meta(
                workers=config[0],
                batch_size=config[1],
                pin_memory=config[2],
                dataset_samples=samples,
            )
    except Exception:
        pass


def _patch_worker_loop(torch):
    # DataLoader looks the function up at each start (`_utils.worker._worker_loop`), and spawn
    # pickles it by name: the wrapper keeps the original's module and qualified name.
    worker = torch.utils.data._utils.worker
    loop = worker._worker_loop
    if _marked(loop):
        return
    try:
        id_index = list(inspect.signature(loop).parameters).index("worker_id")
    except Exception:
        id_index = None

    @functools.wraps(loop)
    def _worker_loop(*args, **kwargs):
        try:
            worker_id = kwargs.get("worker_id")
            if worker_id is None and id_index is not None and id_index < len(args):
                worker_id = args[id_index]
            stallscope.meta(role="loader", parent=os.getppid(), worker=worker_id)
        except Exception:
            pass
        return loop(*args, **kwargs)

    worker._worker_loop = _mark(_worker_loop)


# --- Optimizer: the iteration boundary ----------------------------------------------------


def _ends_iteration():
    """Whether a step now ends an iteration: a backward pass ran since the last end (when
    backward passes are seen at all), and a batch came since (when the last iteration had one).
    After ``_MAX_REFUSED`` refusals in a row the rule gives way, and says no more."""
    global _refused, _backward_seen, _last_had_batch
    no_backward = _backward_seen and _backwards == 0
    no_batch = _last_had_batch and _batches + _experiment.replayed == _replayed_at_end
    if not (no_backward or no_batch):
        return True
    _refused += 1
    if _refused < _MAX_REFUSED:
        return False
    _backward_seen = False
    _last_had_batch = False
    return True


def _end_iteration():
    """Ends the iteration, if the rule says this step does (see ``_ends_iteration``)."""
    global _backwards, _batches, _last_had_batch, _refused, _ends, _replayed_at_end
    if not _ends_iteration():
        return
    _last_had_batch = _batches + _experiment.replayed > _replayed_at_end
    _backwards = 0
    _batches = 0
    _replayed_at_end = _experiment.replayed
    _refused = 0
    _ends += 1
    iteration = stallscope._iter
    stallscope.step()
    _cuda_timing.on_step(iteration)
    _experiment.after_step()


def _patch_optimizer(torch):
    optimizer = torch.optim.Optimizer
    init = optimizer.__init__
    if _marked(init):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            _wrap_step(type(self))
        except Exception:
            pass

    optimizer.__init__ = _mark(__init__)


def _wrap_step(cls):
    """Wraps ``cls.step`` once, at class level.

    The instance's bound ``step`` stays untouched: LR schedulers wrap it themselves and read
    ``optimizer.step.__func__``. A step that calls another wrapped step (``super().step()``,
    an optimizer wrapping another) sends one ``S``, after the outermost call returns.
    """
    step = cls.step
    if _marked(step):
        return

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        if getattr(_step_guard, "active", False):
            return step(*args, **kwargs)
        _step_guard.active = True
        try:
            result = step(*args, **kwargs)
        finally:
            _step_guard.active = False
        try:
            _end_iteration()
        except Exception:
            pass
        return result

    cls.step = _mark(wrapper)


def _patch_grad_scaler(torch):
    """``GradScaler.step`` skips ``optimizer.step()`` when the gradients hold inf or NaN:
    the iteration still ends, when ``scaler.step()`` returns."""
    classes = []
    for path in ("amp", "cuda.amp"):
        mod = torch
        try:
            for part in path.split("."):
                mod = getattr(mod, part)
            cls = getattr(mod, "GradScaler")
        except AttributeError:
            continue
        if cls not in classes:
            classes.append(cls)
    for cls in classes:
        step = cls.__dict__.get("step")
        if step is None or _marked(step):
            continue

        def make(step):
            @functools.wraps(step)
            def wrapper(*args, **kwargs):
                before = _ends
                result = step(*args, **kwargs)
                try:
                    if _ends == before and not getattr(_step_guard, "active", False):
                        _end_iteration()
                except Exception:
                    pass
                return result

            return _mark(wrapper)

        cls.step = make(step)


# --- DDP: exposed gradient communication --------------------------------------------------


class _Relay:
    """State of the comm hook stallscope registers on a DDP module: the hook doing the work.

    It holds no reference to the module, so registering it makes no reference cycle through
    the C++ reducer.
    """

    __slots__ = ("hook", "state", "chosen")

    def __init__(self, hook, state, chosen):
        self.hook = hook
        self.state = state
        self.chosen = chosen  # registered by the program (or DDP itself), not our default


def _relay_hook(state, bucket):
    global _last_bucket_ns, _bucket_bytes, _bucket_count, _first_bucket_ns
    _last_bucket_ns = _monotonic_ns()
    try:
        if _bucket_count == 0:
            _first_bucket_ns = _last_bucket_ns
        if len(_bucket_ready) < _MAX_BUCKET_SIZES:
            _bucket_ready.append(_last_bucket_ns - _first_bucket_ns)
        buf = bucket.buffer()
        _comm_release.keep(buf)
        size = buf.numel() * buf.element_size()
        _bucket_bytes += size
        _bucket_count += 1
        if len(_bucket_sizes) < _MAX_BUCKET_SIZES:
            _bucket_sizes.append(size)
    except Exception:
        pass
    _cuda_timing.on_bucket()
    with _dist_ops.quiet():  # marked as DDP's exposed communication, not op by op
        fut = state.hook(state.state, bucket)
    _comm_release.keep(fut)  # a communication thread must not drop its last reference
    return fut


def _patch_ddp(torch):
    dist = torch.distributed
    if not dist.is_available():
        return
    ddp = torch.nn.parallel.DistributedDataParallel
    init = ddp.__init__
    register = ddp.register_comm_hook
    if _marked(init) or _marked(register):
        return
    relays = weakref.WeakKeyDictionary()  # DDP module -> its _Relay

    def install_relay(module, hook, state, chosen):
        relay = _Relay(hook, state, chosen)
        register(module, relay, _relay_hook)
        relays[module] = relay
        _comm_release.guard_exit()
        if chosen:
            _name_hook(module, hook.__qualname__)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self in relays:  # DDP registered a hook of its own (mixed precision)
            return
        try:
            install_relay(self, _comm_release.allreduce_hook, self.process_group, False)
        except Exception:
            pass

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        relay = relays.get(self)
        if relay is not None and relay.chosen:
            # A second registration fails as it would without stallscope.
            return register(self, state, hook)
        check = getattr(self, "_check_comm_hook", None)
        if check is not None:
            check(hook)  # the program's hook is validated as DDP would
        if relay is None:
            try:
                install_relay(self, hook, state, True)
            except Exception:
                register(self, state, hook)  # succeeds or fails as without stallscope
            return
        relay.hook, relay.state, relay.chosen = hook, state, True
        _name_hook(self, hook.__qualname__)

    ddp.__init__ = _mark(__init__)
    ddp.register_comm_hook = _mark(register_comm_hook)

    # With broadcast_buffers (the default) and a model with buffers (BatchNorm), forward()
    # starts with a blocking broadcast from rank 0: where rank 0 waits for a late peer.
    sync_buffers = getattr(ddp, "_sync_buffers", None)
    if sync_buffers is not None and not _marked(sync_buffers):
        comm = stallscope.phase("comm")

        @functools.wraps(sync_buffers)
        def _sync_buffers(self, *args, **kwargs):
            with comm, _dist_ops.quiet():
                return sync_buffers(self, *args, **kwargs)

        ddp._sync_buffers = _mark(_sync_buffers)

    builtin = getattr(ddp, "_register_builtin_comm_hook", None)
    if builtin is not None:

        @functools.wraps(builtin)
        def _register_builtin_comm_hook(self, comm_hook_type):
            relay = relays.get(self)
            hook = _builtin_python_hook(dist, comm_hook_type)
            if relay is None or relay.chosen or hook is None:
                return builtin(self, comm_hook_type)
            relay.hook, relay.state, relay.chosen = hook, self.process_group, True
            _name_hook(self, str(comm_hook_type))

        ddp._register_builtin_comm_hook = _mark(_register_builtin_comm_hook)


def _name_hook(module, name):
    """DDP's usage logger names the hook the program chose, not the relay; the advisor gets
    its name as meta `comm_hook` (an FP16/BF16 compression hook halves the bytes on the wire)."""
    try:
        module.logger._set_comm_hook_name(name)
    except Exception:
        pass
    stallscope.meta(comm_hook=name)


def _builtin_python_hook(dist, comm_hook_type):
    """The Python equivalent of a built-in C++ comm hook, for a module already relayed."""
    kinds = getattr(dist, "BuiltinCommHookType", None)
    if kinds is None:
        return None
    if comm_hook_type == kinds.ALLREDUCE:
        return _comm_release.allreduce_hook
    if comm_hook_type == kinds.FP16_COMPRESS:
        return _comm_release.fp16_compress_hook
    return None


def _patch_backward(torch):
    # Tensor.backward() calls torch.autograd.backward through the module attribute at call
    # time (1.13 and 2.x), so this one patch sees both spellings, once.
    autograd = torch.autograd
    backward = autograd.backward
    if _marked(backward):
        return

    @functools.wraps(backward)
    def wrapper(*args, **kwargs):
        global _in_backward
        if _in_backward:
            return backward(*args, **kwargs)
        global _backwards, _backward_seen
        start = _monotonic_ns()
        _in_backward = True
        _reset_buckets()
        try:
            return backward(*args, **kwargs)
        finally:
            _in_backward = False
            _backwards += 1
            _backward_seen = True
            ready = _last_bucket_ns
            if ready >= start:
                stallscope.begin("comm", ready)
                stallscope.end("comm")
                _cuda_timing.on_backward_end()
            _send_buckets()

    autograd.backward = _mark(wrapper)


def _reset_buckets():
    global _bucket_bytes, _bucket_count
    _comm_release.new_backward()
    _bucket_bytes = 0
    _bucket_count = 0
    del _bucket_sizes[:]
    del _bucket_ready[:]


def _send_buckets():
    global _comm_sent
    try:
        pair = (_bucket_bytes, _bucket_count)
        if _bucket_count and pair != _comm_sent:
            _comm_sent = pair
            sizes = None
            if _bucket_count <= _MAX_BUCKET_SIZES:
                sizes = ":".join(str(max(1, (s + 500) // 1000)) for s in _bucket_sizes)
            stallscope.meta(comm_bytes=pair[0], comm_buckets=pair[1], comm_bucket_kb=sizes)
        if _bucket_count:
            _overlaps.append(max(0, _last_bucket_ns - _first_bucket_ns))
            if _bucket_count <= _MAX_BUCKET_SIZES:
                _readies.append(tuple(_bucket_ready))
            if len(_overlaps) >= 16:
                spans = sorted(_overlaps)
                del _overlaps[:]
                stallscope.meta(comm_overlap_us=spans[len(spans) // 2] // 1000,
                                comm_bucket_ready_ms=_median_offsets(_readies))
    except Exception:
        pass


def _median_offsets(offsets):
    """Per bucket, the median offset (ms, to 0.1) over the recent backwards in ``offsets`` (a
    list it empties) that had as many buckets as the latest; None without any, or where it
    would not fit a meta value."""
    latest = offsets[-1] if offsets else None
    same = [r for r in offsets if len(r) == len(latest)] if latest else []
    del offsets[:]
    if not same:
        return None
    text = ":".join("%.1f" % (sorted(col)[len(col) // 2] / 1e6) for col in zip(*same))
    return text if len(text) <= 256 else None


# --- torch.distributed --------------------------------------------------------------------


def _patch_init_process_group(torch):
    dist = torch.distributed
    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    init = c10d.init_process_group
    if _marked(init):
        return

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        result = init(*args, **kwargs)
        try:
            stallscope.set_rank(dist.get_rank())
            stallscope.meta(
                local_rank=os.environ.get("LOCAL_RANK"),
                local_world_size=os.environ.get("LOCAL_WORLD_SIZE"),
                world_size=dist.get_world_size(),
                backend=dist.get_backend(),
            )
        except Exception:
            pass
        return result

    _mark(init_process_group)
    if getattr(dist, "init_process_group", None) is init:
        dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group

    # A process group destroyed with a communication thread still holding a callback of
    # stallscope's comm hook would hang: see _comm_release.
    destroy = c10d.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        # The default group destroyed: the training is over, and its last seconds (the
        # teardown, the interpreter's exit) are no hang. meta() never raises.
        if (args[0] if args else kwargs.get("group")) is None:
            stallscope.meta(finishing=1)
        _comm_release.wait_for_release()
        _comm_release.settle()
        return destroy(*args, **kwargs)

    _mark(destroy_process_group)
    if getattr(dist, "destroy_process_group", None) is destroy:
        dist.destroy_process_group = destroy_process_group
    c10d.destroy_process_group = destroy_process_group
