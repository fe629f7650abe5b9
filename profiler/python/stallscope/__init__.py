"""Iteration and phase markers for stallscope.

A training loop tells the profiler where each iteration ends and what it is waiting for, so
that stallscope can attribute every iteration's wall time (compute, data, communication, ...)
instead of guessing from counters alone. Each event is one datagram on the Unix datagram socket
named by ``$STALLSCOPE_SOCKET``, in the wire format that ``analysis/src/marker.rs`` defines::

    SS1 <seq> <t_ns> <pid> <rank> <iter> <event> <phase> [key=value ...]

Profiling must never slow down or break the trainer, so a send never blocks and never raises:
a missing, stale or full socket costs one failed system call and is counted by ``dropped()``.

Each process then moves to a channel of its own: a connected ``SOCK_SEQPACKET`` pair whose two
ends it sends to the profiler with a ``SSR1`` datagram (``SCM_RIGHTS``). The shared socket
queues only ten datagrams whoever sends them, so the profiler had to wake for each burst of
events; a connected pair holds what its sender's buffer holds, and the profiler reads it ten
times a second. Once the profiler has answered (one byte on the pair), the process sends
``SSC1`` on the shared socket, the last datagram there, and every later event on its pair, so
its events keep their order. A profiler that does not answer leaves the process on the shared
socket, as before.
Without ``$STALLSCOPE_SOCKET`` events go to a node agent's socket when one exists: a root
agent's (``/run/stallscope/agent.sock``), else this user's own (``agent.sock`` under
``$XDG_RUNTIME_DIR/stallscope`` or ``/tmp/stallscope-UID``), each only from a directory that
root or this user owns and nobody else may write in, so a socket another user planted is never
used; else every call returns at once. The module uses the standard library only, so it loads
in any environment the training script runs in.

Usage::

    import stallscope
    for batch in loader:
        with stallscope.phase("compute"):
            ...
        stallscope.step()
"""

import array
import collections
import itertools
import os
import socket
import threading
import time

__all__ = ["step", "phase", "begin", "end", "meta", "set_rank", "dropped", "enabled"]

# Limits of the wire format (marker.rs).
_MAX_DATAGRAM = 4096
_MAX_NAME = 64
_MAX_VALUE = 256
_NAME_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
_VALUE_CHARS = _NAME_CHARS | {ord("/")}
# Per-name encodings are cached for speed; a program inventing names without end must not make
# the cache grow without end.
_MAX_CACHED_NAMES = 1024

_monotonic_ns = time.monotonic_ns
_getpid = os.getpid


#: Where a root ``stallscope agent`` listens, for every user of the node.
AGENT_SOCKET = "/run/stallscope/agent.sock"


def _own_runtime_dir():
    uid = os.getuid()
    if uid == 0:
        return "/run/stallscope"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "stallscope")
    return os.path.join("/tmp", "stallscope-%d" % uid)


def _trusted_dir(path):
    """Whether ``path`` is a directory (not a link) of root or this user that no other user
    may write in."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid in (0, os.getuid())
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _agent_socket():
    for path in (AGENT_SOCKET, os.path.join(_own_runtime_dir(), "agent.sock")):
        if os.path.exists(path) and _trusted_dir(os.path.dirname(path)):
            return path
    return None


def _open_socket():
    try:
        path = os.environ.get("STALLSCOPE_SOCKET") or _agent_socket()
    except Exception:
        path = None
    if not path:
        return None, None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
    except OSError:
        return None, None
    return sock, os.fsencode(path)


_sock, _addr = _open_socket()


def _env_rank():
    try:
        rank = int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1
    return rank if 0 <= rank <= 0xFFFFFFFF else -1


# Per-process state; _adopt() renews it in a forked child, which numbers its own events.
_rank = _env_rank()
_pid = 0
_ident = b""  # "<pid> <rank>", encoded once
_seq = itertools.count()  # next() is atomic under the GIL, so no seq is ever handed out twice
_iter = 0
_dropped = 0
# Facts whose ``M`` datagram found the socket full, sent again after a later step that found
# room (never into a socket that stays full or is gone: no datagram more than before). A fact is
# sent once (DDP's bytes per iteration, the loader's workers), so one datagram lost while the
# profiler was behind would lose it for the whole run; the reader keeps each key's latest value,
# so a late copy is as good. Bounded: at most ``_MAX_UNSENT_META`` keys wait.
_unsent_meta = {}
_MAX_UNSENT_META = 64
# Datagrams a full socket refused, oldest first, sent before any newer one once it has room.
# A Unix datagram socket queues only ``net.unix.max_dgram_qlen`` datagrams (10 on Debian): a
# profiler descheduled for a millisecond on a loaded machine would otherwise lose a fast loop's
# markers (in CI, iterations 2-6 and the data phase its hang was in). Bounded: beyond
# ``_MAX_HELD`` an event is dropped (and counted), as before; never waited for.
_held = collections.deque()
_MAX_HELD = 1024
# One sender of held datagrams at a time, so that they leave in order; taken without waiting
# (an event that finds it taken is held behind them).
_flush_lock = threading.Lock()
# While events are held and the training sends nothing more (a rank stuck in a collective or
# in its DataLoader: just when the profiler needs its last events), a daemon thread sends them
# once the socket has room. Started at the first event held; it naps 5 ms, doubling up to
# 200 ms while the socket stays full, and waits on ``_flusher_wake`` while nothing is held.
_flusher_wake = threading.Event()
_flusher_pid = 0

# This process's own channel (see the module's docs): the pair's sending end once the profiler
# answered (``_chan``), or while it has not yet (``_pending``); registrations tried.
_REGISTER = b"SSR1"
_SWITCH = b"SSC1"
_chan = None
_pending = None
_answered = False
_pending_since = 0
_channel_tries = 0
# A registration not answered within this long is given up (an older profiler, or one that
# took too many channels); at most this many registrations per process.
_PENDING_PATIENCE_NS = 1_000_000_000
_MAX_CHANNEL_TRIES = 2
_channel_lock = threading.Lock()


def _adopt(pid):
    global _pid, _ident, _seq, _iter, _dropped, _flush_lock, _flusher_wake
    global _chan, _pending, _answered, _pending_since, _channel_tries, _channel_lock
    _pid = pid
    _ident = b"%d %d" % (pid, _rank)
    _seq = itertools.count()
    _iter = 0
    _dropped = 0
    _unsent_meta.clear()  # a fork's parent's facts are not its own
    _held.clear()  # nor its held events
    # Nor its flusher (threads do not survive a fork) or its locks, which a parent's thread
    # may have held at the fork.
    _flush_lock = threading.Lock()
    _flusher_wake = threading.Event()
    # Nor its channel: the child's copies of the parent's ends are closed (the parent's stay
    # open), and the child registers one of its own.
    for inherited in (_chan, _pending):
        if inherited is not None:
            try:
                inherited.close()
            except Exception:
                pass
    _chan = _pending = None
    _answered = False
    _pending_since = _channel_tries = 0
    _channel_lock = threading.Lock()


_adopt(_getpid())


def _send(tail, t_ns=None):
    """Sends one event; ``tail`` is the encoded ``<event> <phase> [fields]``. True when the
    socket took it or it is held until the socket has room (:data:`_held`); False when it is
    lost."""
    global _dropped
    try:
        if t_ns is None:
            t_ns = _monotonic_ns()
        elif t_ns < 0:
            raise ValueError("negative time")
        if _getpid() != _pid:
            _adopt(_getpid())
        datagram = b"SS1 %d %d %s %d %s" % (next(_seq), t_ns, _ident, _iter, tail)
        if _held or _flush_lock.locked():
            if not _flush_lock.acquire(False):  # another thread is sending them now
                return _hold(datagram, 2 * _MAX_HELD)
            try:
                flushed = _flush_held()
            finally:
                _flush_lock.release()
            if not flushed:
                return _hold(datagram)
        _transmit(datagram)
        if _chan is None:
            _channel_step()
        return True
    except BlockingIOError:  # full: the profiler is behind
        return _hold(datagram)
    except Exception:  # missing, refused, anything: the trainer goes on
        _dropped += 1  # may lose a count under thread races; never blocks
        return False


def _transmit(datagram):
    """Sends one datagram on this process's channel once it has one, else on the shared
    socket; raises what the send raises (``BlockingIOError`` when full). A channel the
    profiler closed is left for the shared socket."""
    global _chan
    chan = _chan
    if chan is not None:
        try:
            chan.send(datagram)
            return
        except BlockingIOError:
            raise
        except OSError:  # the profiler closed it (stopped, or too many channels)
            _chan = None
            try:
                chan.close()
            except Exception:
                pass
    _sock.sendto(datagram, _addr)


def _channel_step():
    """One step, never blocking, towards this process's own channel, after an event the shared
    socket took: register a pair, then, once the profiler answered and nothing is held, say
    ``SSC1`` on the shared socket and send on the pair from then on. Gives up (the shared
    socket stays) when the profiler closes the pair unanswered, or after
    ``_PENDING_PATIENCE_NS`` without an answer."""
    global _chan, _pending, _answered, _pending_since, _channel_tries
    if not _channel_lock.acquire(False):
        return
    try:
        if _pending is None:
            if _channel_tries >= _MAX_CHANNEL_TRIES or _held:
                return
            _channel_tries += 1
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                ours.setblocking(False)
                fds = array.array("i", [theirs.fileno(), ours.fileno()])
                _sock.sendmsg([_REGISTER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], 0, _addr)
            except Exception:  # full, gone, or no SCM_RIGHTS here: the shared socket stays
                ours.close()
                return
            finally:
                theirs.close()
            _pending, _answered, _pending_since = ours, False, _monotonic_ns()
            return
        if not _answered:
            try:
                answer = _pending.recv(1)
            except BlockingIOError:
                answer = None
            if answer == b"":  # closed unanswered: the profiler took no channel from us
                _give_up_pending()
                return
            _answered = answer == b"\x01"
            if not _answered:
                if _monotonic_ns() - _pending_since > _PENDING_PATIENCE_NS:
                    _give_up_pending()
                return
        if _held:
            return
        try:
            _sock.sendto(_SWITCH, _addr)
        except BlockingIOError:  # full: tried again after the next event
            return
        _chan, _pending = _pending, None
    except Exception:  # anything else: the shared socket stays
        _give_up_pending()
    finally:
        _channel_lock.release()


def _give_up_pending():
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        try:
            pending.close()
        except Exception:
            pass


def _hold(datagram, bound=_MAX_HELD):
    """Keeps ``datagram`` for the next send that finds room; False (counted lost) when
    ``bound`` are held already (:data:`_MAX_HELD`, or twice that while another thread is
    sending them: the queue is draining then, and this event could not send them itself)."""
    global _dropped
    if len(_held) < bound:
        _held.append(datagram)
        _wake_flusher()
        return True
    _dropped += 1
    return False


def _flush_held():
    """Sends the held datagrams, oldest first, while the socket takes them; True when none is
    left. A socket that is gone loses them all (counted). Called with ``_flush_lock`` held."""
    global _dropped
    while _held:
        try:
            _transmit(_held[0])
        except BlockingIOError:
            return False
        except Exception:  # gone or refused: nobody will read them
            _dropped += len(_held)
            _held.clear()
            return True
        _held.popleft()
    return True


def _wake_flusher():
    """Has the daemon thread send what is held, starting it in this process if need be."""
    global _flusher_pid
    try:
        if _flusher_pid != _pid:
            _flusher_pid = _pid
            threading.Thread(target=_flush_in_background, name="stallscope-flush",
                             daemon=True).start()
        if not _flusher_wake.is_set():  # a flag read: the lock inside is taken once per wake
            _flusher_wake.set()
    except Exception:  # no thread: the next event that finds room sends them, as before
        pass


def _flush_in_background():
    """The flusher: sends the held events whenever some are held and the socket has room."""
    wake = _flusher_wake
    while True:
        wake.wait()
        wake.clear()
        nap = 0.005
        while _held:
            if _flush_lock.acquire(False):
                try:
                    if _flush_held():
                        break
                finally:
                    _flush_lock.release()
            time.sleep(nap)
            nap = min(nap * 2, 0.2)


def _clean(text, allowed, limit):
    """Maps ``text`` into the wire alphabet: other characters become ``_``."""
    raw = str(text).encode("ascii", "replace")[:limit]
    return bytes(b if b in allowed else 0x5F for b in raw)


_tails = {}


def _tail(event, name):
    """The encoded ``<event> <phase>`` for a phase name, or None if the name is unusable."""
    try:
        key = (event, name)
        tail = _tails.get(key)
        if tail is None:
            clean = _clean(name, _NAME_CHARS, _MAX_NAME)
            if not clean:
                return None
            tail = event + b" " + clean
            if len(_tails) < _MAX_CACHED_NAMES:
                _tails[key] = tail
        return tail
    except Exception:  # e.g. an unhashable name
        return None


def _count_drop(events=1):
    global _dropped
    _dropped += events


def _phase_event(kind, name, t_ns, waits_for=None):
    if _sock is None:
        return
    tail = _tail(kind, name)
    if tail is None:
        _count_drop()
        return
    if waits_for is not None:
        try:
            pid = int(waits_for)
            if 0 < pid <= 0xFFFFFFFF:
                tail += b" w=%d" % pid
        except Exception:  # not a number: the phase goes without it
            pass
    _send(tail, t_ns)


def begin(name, t_ns=None, waits_for=None):
    """The phase ``name`` begins (now, or at ``t_ns`` on ``time.monotonic_ns()``'s clock).

    ``waits_for``: the pid of the process this phase waits for (say, the loader worker whose
    batch is next), so that the stall is read from what that process did.
    """
    _phase_event(b"B", name, t_ns, waits_for)


def end(name, t_ns=None):
    """The phase ``name`` ends (now, or at ``t_ns``)."""
    _phase_event(b"E", name, t_ns)


def _op_span(name, begin_ns, end_ns, op, group, seq, nbytes, peer=None):
    """Sends phase ``name`` from ``begin_ns`` to ``end_ns`` as one communication operation:
    ``op`` (a function name), ``group`` (a small id), ``seq``, ``nbytes`` and, for a send or
    receive, ``peer`` (global rank). See ``_dist_ops``."""
    if _op_begin(name, begin_ns, op, group, seq, nbytes, peer):
        end(name, end_ns)


def _op_begin(name, begin_ns, op, group, seq, nbytes, peer=None):
    """Sends the begin of phase ``name`` as one communication operation (see ``_op_span``);
    whether it was sent, so that its end is sent only then."""
    if _sock is None:
        return False
    begin_tail = _tail(b"B", name)
    if begin_tail is None or _tail(b"E", name) is None:
        _count_drop(2)
        return False
    fields = b" op=%s g=%d n=%d b=%d" % (
        _clean(op, _NAME_CHARS, _MAX_NAME), int(group), int(seq), int(nbytes))
    if peer is not None:
        fields += b" p=%d" % int(peer)
    _send(begin_tail + fields, begin_ns)
    return True


class _Phase:
    """Context manager sending ``B`` on entry and ``E`` on exit; exceptions pass through."""

    __slots__ = ("_begin", "_end")

    def __init__(self, begin_tail, end_tail):
        self._begin = begin_tail
        self._end = end_tail

    def __enter__(self):
        _send(self._begin)
        return self

    def __exit__(self, *exc):
        _send(self._end)
        return False


class _NoPhase:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_PHASE = _NoPhase()
_phases = {}


def phase(name):
    """Context manager marking a phase: ``with stallscope.phase("compute"): ...``."""
    if _sock is None:
        return _NO_PHASE
    try:
        return _phases[name]
    except Exception:  # not cached yet, or unhashable
        pass
    begin_tail, end_tail = _tail(b"B", name), _tail(b"E", name)
    if begin_tail is None:
        _count_drop(2)
        return _NO_PHASE
    ctx = _Phase(begin_tail, end_tail)
    if len(_phases) < _MAX_CACHED_NAMES:
        try:
            _phases[name] = ctx
        except TypeError:
            pass
    return ctx


def step():
    """The current iteration is complete: sends ``S`` for it, then counts it."""
    global _iter
    if _sock is None:
        return
    sent = _send(b"S iter")
    _iter += 1
    if sent and _unsent_meta:  # the socket has room again: the facts it refused go now
        _resend_meta()


def _resend_meta():
    try:
        fields = dict(_unsent_meta)
        _unsent_meta.clear()
        meta(**fields)
    except Exception:  # the trainer goes on
        pass


def meta(**fields):
    """Sends facts about this process as ``key=value`` fields (``M`` event).

    Keys and values are mapped into the wire alphabet; ``None`` values, empty keys and fields
    that would make the datagram too long are left out. Booleans are sent as 1 or 0.
    """
    if _sock is None:
        return
    try:
        parts = [b"M -"]
        size = 160  # room for the fixed fields
        for key, value in fields.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = int(value)
            k = _clean(key, _NAME_CHARS, _MAX_NAME)
            if not k:
                continue
            field = k + b"=" + _clean(value, _VALUE_CHARS, _MAX_VALUE)
            size += len(field) + 1
            if size > _MAX_DATAGRAM:
                break
            parts.append(field)
        tail = b" ".join(parts)
    except Exception:
        _count_drop()
        return
    if _send(tail):
        if _unsent_meta:
            for key in fields:
                _unsent_meta.pop(key, None)
    else:
        try:
            for key, value in fields.items():
                if key in _unsent_meta or len(_unsent_meta) < _MAX_UNSENT_META:
                    _unsent_meta[key] = value
        except Exception:
            pass


def set_rank(rank):
    """Sets the global rank carried by this process's events (``-1``: unknown)."""
    global _rank, _ident
    try:
        rank = int(rank)
    except (TypeError, ValueError):
        return
    _rank = rank if 0 <= rank <= 0xFFFFFFFF else -1
    _ident = b"%d %d" % (_pid, _rank)


def dropped():
    """How many events this process could not deliver."""
    return _dropped


def enabled():
    """Whether events go anywhere (``$STALLSCOPE_SOCKET`` was set)."""
    return _sock is not None


# At most this long, at interpreter exit, for the last event to find room in a full socket.
_GOODBYE_PATIENCE_S = 0.2


def _goodbye(sleep=time.sleep):
    """At exit: one last event, ``M - exit=1``, whose ``seq`` tells the reader how many of this
    process's last events were lost (a gap is seen only before an event that arrives).

    Only this event and those held before it (:data:`_held`) wait, and only at exit and only
    while the socket is full: up to ``_GOODBYE_PATIENCE_S``, in 5 ms naps, for a profiler that
    fell behind. The training's own work is done by then; what a socket still full after that
    did not take is lost.
    """
    global _dropped
    if _sock is None or _getpid() != _pid:
        return  # a fork that never sent anything has nothing to say
    try:
        datagram = b"SS1 %d %d %s %d M - exit=1" % (next(_seq), _monotonic_ns(), _ident, _iter)
    except Exception:
        return
    _held.append(datagram)  # the last one, past the bound if need be
    deadline = _monotonic_ns() + int(_GOODBYE_PATIENCE_S * 1e9)
    # The flusher may be sending: take the lock (within the patience) so that the order holds.
    locked = _flush_lock.acquire(timeout=_GOODBYE_PATIENCE_S)
    try:
        while not _flush_held():  # full: the profiler is behind; wait a little
            if _monotonic_ns() >= deadline:
                break
            try:
                sleep(0.005)
            except Exception:
                break
    finally:
        if locked:
            _flush_lock.release()
    _dropped += len(_held)
    _held.clear()


if _sock is not None:
    import atexit

    atexit.register(_goodbye)
