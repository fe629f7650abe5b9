"""Times every ``torch.distributed`` collective and point-to-point operation.

A pipeline-parallel job exchanges activations with ``dist.send``/``dist.recv``; a rank blocked
in ``recv`` while the previous stage still computes is waiting for a peer, not moving data.
Telling the two apart needs each operation's identity on every rank, so each call becomes a
``comm`` span whose ``B`` event names it: ``op=`` the function, ``g=`` a small id of its
process group (torch numbers groups in creation order, the same on every rank; the default
group is 0), ``n=`` its number (per group and op for a collective, per peer and direction for
a send or receive), ``b=`` the bytes of its tensors on this rank (for a reduce-scatter its
input, the whole tensor reduced, not the shard it returns), and ``p=`` the peer's global
rank for a send or receive. Each group's size and global ranks go once as meta
``group.<id>=<size>/<r0:r1:…>``, and the name of the DeviceMesh dimension it is, when it is
one, as ``group_dim.<id>=<name>`` (``tp``, ``dp``, as the mesh's ``mesh_dim_names`` say). The analysis matches the operation across ranks by that
identity.

DTensor (tensor parallel) does not call these functions: it issues functional collectives
(``torch.distributed._functional_collectives``: ``all_reduce``, ``all_gather_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``, ``broadcast``), which return at once and are
waited for when their result is first used (``wait_tensor``). Those are wrapped too
(``install_functional``), and marked as asynchronous operations are: the
wait. A group they run on that no DeviceMesh dimension names is sent as
``group_role.<id>=tp``: DTensor's collectives are tensor parallelism's.

A blocking call sends its ``B`` event as it is entered and its ``E`` as it returns (or
raises: the time until the failure was spent in it, and its number is taken), so a rank stuck
inside a collective is seen to be in it while it blocks: the hang report reads that open span.
An asynchronous one (``isend``, ``async_op=True``, ``batch_isend_irecv``) sends both events
when its ``Work.wait()`` returns, with the time its first wait began as the begin: what it
holds the loop up is the wait, not the compute a pipeline schedule runs between posting a
send or receive and waiting for it (one never waited for is never marked). A receive from any
source sends both as it returns, to name the sender it got. So overlapping operations of one
thread never interleave their events.

Transparent: the wrapper returns what the function returned and lets its exceptions through
(an asynchronous operation that fails is not marked); calls made inside another marked
operation, inside DDP's
gradient communication (marked by the DDP hook as its exposed part) or DDP's buffer broadcast
are not marked again (``quiet``). Only the functions the running torch has are wrapped, under
both ``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X``.
"""

import functools
import inspect
import threading
import time
import zlib

import stallscope

_monotonic_ns = time.monotonic_ns
_local = threading.local()
_lock = threading.Lock()

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
)
REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base")
SENDS = ("send", "isend")
RECEIVES = ("recv", "irecv")
# Operations that return works: their end is their last work's wait.
ASYNCHRONOUS = ("isend", "irecv", "batch_isend_irecv")

# Next number per (group id, op) for collectives, per (peer, "send"|"recv") for P2P.
_numbers = {}
# Group ids whose meta was sent.
_groups_sent = set()
# Asynchronous operations issued and not yet waited for: id(work) -> (work, record). Bounded:
# a program that never waits for its works loses the oldest records, not memory.
_pending = {}
_MAX_PENDING = 256


class quiet:
    """Context manager: operations called inside are not marked (they belong to a span
    marked otherwise, such as DDP's gradient all-reduce)."""

    __slots__ = ()

    def __enter__(self):
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc):
        _local.depth -= 1


def install(torch):
    """Wraps the operations the running torch has; idempotent, never raises."""
    dist = torch.distributed
    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    for name in COLLECTIVES + SENDS + RECEIVES:
        try:
            _wrap(torch, dist, c10d, name)
        except Exception:
            pass
    try:
        _wrap_wait(c10d)
    except Exception:
        pass
    install_functional(torch)


FUNCTIONAL = (
    "all_reduce",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
)
# Functional collectives issued and not yet waited for: the address of their result's memory
# -> record.
_pending_functional = {}


def install_functional(torch):
    """Wraps DTensor's functional collectives (torch 2.x; nothing on 1.x); idempotent, never
    raises. Imports their module (3 ms), which DTensor reads its functions from at each call."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except Exception:
        return
    c10d = torch.distributed.distributed_c10d
    for name in FUNCTIONAL:
        try:
            _wrap_functional(torch, funcol, c10d, name)
        except Exception:
            pass
    try:
        _wrap_wait_tensor(funcol)
    except Exception:
        pass


def _wrap_functional(torch, funcol, c10d, name):
    original = getattr(funcol, name, None)
    if original is None or getattr(original, "_stallscope", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "depth", 0):
            return original(*args, **kwargs)
        start = _monotonic_ns()
        _local.depth = 1
        try:
            result = original(*args, **kwargs)
        finally:
            _local.depth = 0
        try:
            _issued(torch, funcol, c10d, name, signature, args, kwargs, start, result)
        except Exception:
            pass
        return result

    wrapper._stallscope = True
    setattr(funcol, name, wrapper)


def _issued(torch, funcol, c10d, name, signature, args, kwargs, start, result):
    """Marks a functional collective now when it already completed, or keeps it until its
    result is waited for."""
    if funcol._are_we_tracing():
        return  # torch.compile traces it: the compiled graph runs it, not this call
    bound = signature.bind_partial(*args, **kwargs).arguments
    group = c10d._resolve_process_group(funcol._resolve_group_name(bound["group"], bound.get("tag", "")))
    gid = _group_id(c10d, group)
    if gid is None:
        return
    if gid not in _tensor_parallel_sent:
        _tensor_parallel_sent.add(gid)
        desc = str(getattr(group, "group_desc", "") or "")
        if not (desc.startswith("mesh_") and not desc.startswith("mesh_dim_")):
            stallscope.meta(**{"group_role.%d" % gid: "tp"})
    key = (gid, "functional." + name)
    with _lock:
        seq = _numbers.get(key, 0)
        _numbers[key] = seq + 1
    # An all-gather's bytes are the whole tensor gathered; the others', the tensor given.
    nbytes = _bytes(torch, bound.get("self"))
    if name == "all_gather_tensor":
        nbytes *= group.size()
    record = [start, name, gid, seq, nbytes, None]
    elem = getattr(result, "elem", None)
    if not isinstance(elem, torch.Tensor):
        _send(record, _monotonic_ns())  # waited for already (a gather on another dim)
        return
    with _lock:
        while len(_pending_functional) >= _MAX_PENDING:
            _pending_functional.pop(next(iter(_pending_functional)))
        _pending_functional[_storage(elem)] = record


def _storage(tensor):
    """The address of the memory a tensor views: a view of a pending collective's result (DTensor
    reshapes it before waiting) is waited for in its stead. No tensor is kept alive."""
    return tensor.untyped_storage().data_ptr()


# Groups whose DTensor role was sent.
_tensor_parallel_sent = set()


def _wrap_wait_tensor(funcol):
    """Wraps ``wait_tensor``, which an AsyncCollectiveTensor calls (through the module) when its
    value is first needed: waiting for a pending functional collective ends it."""
    wait = getattr(funcol, "wait_tensor", None)
    if wait is None or getattr(wait, "_stallscope", False):
        return

    @functools.wraps(wait)
    def wrapper(tensor, *args, **kwargs):
        entered = _monotonic_ns()
        result = wait(tensor, *args, **kwargs)
        if _pending_functional:
            try:
                with _lock:
                    record = _pending_functional.pop(_storage(tensor), None)
                if record is not None:
                    record[0] = max(record[0], entered)
                    _send(record, _monotonic_ns())
            except Exception:
                pass
        return result

    wrapper._stallscope = True
    funcol.wait_tensor = wrapper


def _wrap(torch, dist, c10d, name):
    original = getattr(c10d, name, None)
    if original is None or getattr(original, "_stallscope", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "depth", 0):
            return original(*args, **kwargs)
        start = _monotonic_ns()
        entered = _entered(torch, c10d, name, signature, args, kwargs, start)
        _local.depth = 1
        try:
            result = original(*args, **kwargs)
        finally:
            _local.depth = 0
            if entered:
                stallscope.end("comm")
        if not entered:
            try:
                _completed(torch, c10d, name, signature, args, kwargs, start, result)
            except Exception:
                pass
        return result

    wrapper._stallscope = True
    if getattr(dist, name, None) is original:
        setattr(dist, name, wrapper)
    setattr(c10d, name, wrapper)


def _entered(torch, c10d, name, signature, args, kwargs, start):
    """Sends the begin of a blocking operation whose identity is known before it runs; whether
    it did (then its end is sent as it returns). Never raises."""
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
        if name in ASYNCHRONOUS or bound.get("async_op"):
            return False
        if name in RECEIVES and bound.get("src") is None and bound.get("group_src") is None:
            return False  # from any source: the sender is known once it returns
        record = _identify(torch, c10d, name, bound, None, start)
        return record is not None and stallscope._op_begin("comm", *record)
    except Exception:
        return False


def _completed(torch, c10d, name, signature, args, kwargs, start, result):
    """Marks the operation just returned from, or keeps it until its work is waited for."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    record = _identify(torch, c10d, name, bound, result, start)
    if record is None:
        return
    works = _works(name, bound, result)
    if not works:
        _send(record, _monotonic_ns())
        return
    record.append(len(works))  # waits still to come
    with _lock:
        while len(_pending) >= _MAX_PENDING:
            _pending.pop(next(iter(_pending)))
        for work in works:
            _pending[id(work)] = (work, record)


def _works(name, bound, result):
    """The asynchronous works whose ``wait()`` ends the operation; none for a blocking call."""
    if name == "batch_isend_irecv":
        return [w for w in (result or []) if w is not None]
    if name in ("isend", "irecv") or bound.get("async_op"):
        return [result] if result is not None else []
    return []


def _identify(torch, c10d, name, bound, result, start):
    """``[start, op, group id, seq, bytes, peer]`` for the call; None when it needs no mark
    (this rank is not in its group)."""
    group = bound.get("group")
    if name == "batch_isend_irecv":
        ops = list(bound.get("p2p_op_list") or [])
        group = getattr(ops[0], "group", None) if ops else None
        nbytes = sum(_bytes(torch, getattr(op, "tensor", None)) for op in ops)
    else:
        tensors = list(bound.values())[:2]
        # A reduce-scatter's output is this rank's shard; its input is the whole tensor it
        # reduces, as an all-gather's output is the whole tensor it gathers.
        scatters = name in REDUCE_SCATTERS and len(tensors) == 2
        nbytes = _bytes(torch, tensors[1] if scatters else (tensors[0] if tensors else None))
    gid = _group_id(c10d, group)
    if gid is None:
        return None
    peer = None
    if name in SENDS or name in RECEIVES:
        end = "dst" if name in SENDS else "src"
        peer = bound.get(end)
        if peer is None and bound.get("group_" + end) is not None:
            peer = c10d.get_global_rank(group, bound["group_" + end])
        if peer is None and name == "recv" and isinstance(result, int) and result >= 0:
            peer = result  # from any source: the sender it got
    if peer is not None:
        key = (int(peer), "send" if name in SENDS else "recv")
    else:
        key = (gid, name)
    with _lock:
        seq = _numbers.get(key, 0)
        _numbers[key] = seq + 1
    return [start, name, gid, seq, nbytes, peer]


def _send(record, end_ns):
    start, name, gid, seq, nbytes, peer = record[:6]
    stallscope._op_span("comm", start, end_ns, name, gid, seq, nbytes, peer)


def _bytes(torch, obj):
    """Bytes of a tensor, or of the tensors in a list or tuple of them."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(torch, x) for x in obj[:4096] if isinstance(x, torch.Tensor))
    return 0


def _group_id(c10d, group):
    """The group's small id (0 for the default group), sending its meta the first time; None
    when this rank is not in it."""
    world = c10d.GroupMember.WORLD
    if group is None:
        group = world
    if group is None or group is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
        return None
    name = _group_name(c10d, group)
    if name is None:
        gid = 0 if group is world else zlib.crc32(repr(id(group)).encode()) & 0x7FFFFFFF
    elif name.isdigit():
        gid = int(name)
    else:
        gid = zlib.crc32(name.encode()) & 0x7FFFFFFF
    if gid not in _groups_sent:
        _groups_sent.add(gid)
        _group_meta(c10d, gid, group)
    return gid


def _group_name(c10d, group):
    try:
        return str(c10d._get_process_group_name(group))
    except Exception:
        pass
    names = getattr(c10d, "_pg_names", None)
    if names is not None and group in names:
        return str(names[group])
    name = getattr(group, "group_name", None)
    return None if name is None else str(name)


def _group_meta(c10d, gid, group):
    try:
        try:
            ranks = c10d.get_process_group_ranks(group)
        except Exception:
            ranks = sorted(c10d._pg_group_ranks[group])
        text = "%d/%s" % (len(ranks), ":".join(str(r) for r in ranks))
        if len(text) > 256:
            text = str(len(ranks))
        fields = {"group.%d" % gid: text}
        # A DeviceMesh names each dimension's group "mesh_<dim>" (torch 2.x): "tp", "dp", …
        desc = str(getattr(group, "group_desc", "") or "")
        if desc.startswith("mesh_") and not desc.startswith("mesh_dim_"):
            fields["group_dim.%d" % gid] = desc[len("mesh_"):]
        stallscope.meta(**fields)
    except Exception:
        pass


def _wrap_wait(c10d):
    """Wraps ``Work.wait`` at class level: waiting for the last work of a pending operation
    ends it."""
    work_cls = getattr(c10d, "Work", None)
    wait = getattr(work_cls, "wait", None)
    if wait is None or getattr(wait, "_stallscope", False):
        return

    @functools.wraps(wait)
    def wrapper(self, *args, **kwargs):
        entered = _monotonic_ns()
        result = wait(self, *args, **kwargs)
        if _pending:
            try:
                _waited(self, entered)
            except Exception:
                pass
        return result

    wrapper._stallscope = True
    work_cls.wait = wrapper


def _waited(work, entered):
    """Work ``work``, waited for from ``entered`` (ns), has returned: the operation's span
    begins at its first wait and ends with its last."""
    with _lock:
        entry = _pending.pop(id(work), None)
        if entry is None:
            return
        if entry[0] is not work:  # a work freed unwaited, its id reused
            _pending[id(work)] = entry
            return
        record = entry[1]
        if len(record) == 7:
            record[0] = max(record[0], entered)
            record.append(True)  # its first wait's entry is the begin
        record[6] -= 1
        done = record[6] == 0
    if done:
        _send(record, _monotonic_ns())
