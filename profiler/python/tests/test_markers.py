"""The marker package: wire format, sequence numbers, and never blocking or raising.

``parse`` mirrors ``analysis/src/marker.rs`` so that these tests check the wire contract, not
this package's idea of it; ``Receiver`` collects datagrams from a real Unix socket. The torch
hook tests use both.
"""

import array
import importlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import stallscope  # noqa: E402  (needs PYTHON_DIR on sys.path)

MAX_DATAGRAM = 4096
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.:/-]{0,256}\Z")
_UNSIGNED = re.compile(r"[0-9]+\Z")


class Marker:
    __slots__ = ("seq", "t_ns", "pid", "rank", "iter", "event", "phase", "fields")

    def __repr__(self):
        return "Marker({} {} {} {} {} {} {} {})".format(
            self.seq, self.t_ns, self.pid, self.rank, self.iter, self.event, self.phase, self.fields
        )


def _unsigned(field, text):
    if not _UNSIGNED.match(text):
        raise ValueError("{} is not a number: {!r}".format(field, text))
    return int(text)


def parse(datagram):
    """Parses one datagram as marker.rs does; raises ValueError with the reason otherwise."""
    if len(datagram) > MAX_DATAGRAM:
        raise ValueError("too long")
    text = datagram.decode("ascii")  # UnicodeDecodeError is a ValueError
    fields = text.split()
    if not fields or fields[0] != "SS1":
        raise ValueError("protocol")
    if len(fields) < 8:
        raise ValueError("fields")
    m = Marker()
    m.seq = _unsigned("seq", fields[1])
    m.t_ns = _unsigned("t_ns", fields[2])
    m.pid = _unsigned("pid", fields[3])
    if not re.match(r"-?[0-9]+\Z", fields[4]):
        raise ValueError("rank")
    m.rank = int(fields[4])
    if m.rank < -1:
        raise ValueError("rank")
    m.iter = _unsigned("iter", fields[5])
    m.event, m.phase, m.fields = fields[6], fields[7], {}
    if m.event in ("B", "E"):
        if not _NAME.match(m.phase):
            raise ValueError("name {!r}".format(m.phase))
        for f in fields[8:]:
            k, sep, v = f.partition("=")
            if k == "w":
                if not sep or not re.match(r"[0-9]+\Z", v):
                    raise ValueError("w {!r}".format(f))
                m.fields["w"] = v
            elif k == "op" and m.event == "B":
                if not _NAME.match(v):
                    raise ValueError("op {!r}".format(f))
                m.fields["op"] = v
            elif k in ("g", "n", "b", "p") and m.event == "B":
                if not sep or not re.match(r"[0-9]+\Z", v):
                    raise ValueError("{} {!r}".format(k, f))
                m.fields[k] = v
    elif m.event == "M":
        for f in fields[8:]:
            k, sep, v = f.partition("=")
            if not sep or not _NAME.match(k) or not _VALUE.match(v):
                raise ValueError("meta {!r}".format(f))
            m.fields[k] = v
    elif m.event != "S":
        raise ValueError("event {!r}".format(m.event))
    return m


# The datagrams that move a process to its own channel (agent/src/markers.rs): not markers.
REGISTER, SWITCH = b"SSR1", b"SSC1"


def next_marker(sock):
    """The next marker datagram of ``sock``, parsed, past the channel's datagrams; raises what
    ``recv`` raises (``BlockingIOError`` when none is left)."""
    while True:
        d = sock.recv(65536)
        if d not in (REGISTER, SWITCH):
            return parse(d)


class Receiver:
    """Binds a socket at ``path`` and collects what arrives on a thread until ``stop()``, as the
    profiler's listener does: it answers a process's channel (``answer``; an older profiler
    does not) and reads it from that process's ``SSC1`` on.

    The kernel queues only a few datagrams per Unix socket (net.unix.max_dgram_qlen, 10 by
    default), so the receiver drains it continuously, as the profiler's listener must.
    """

    def __init__(self, path, answer=True):
        self.path = path
        self.answer = answer
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.datagrams = []
        #: Datagrams that came on a process's channel (the rest came on the shared socket).
        self.on_channels = 0
        self._waiting = {}  # pid -> channel registered, until its SSC1
        self._channels = []
        self._drop = threading.Event()  # drop_channels() asked; the thread clears it once done
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _shared(self):
        fd_size = array.array("i").itemsize
        data, ancillary, _, _ = self.sock.recvmsg(
            65536, socket.CMSG_SPACE(2 * fd_size) + socket.CMSG_SPACE(3 * fd_size))
        pid, fds = None, []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = array.array("i", payload[:3 * fd_size])[0]
            elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % fd_size]))
        if data == REGISTER:
            ends = [socket.socket(fileno=fd) for fd in fds]
            if self.answer and len(ends) == 2:
                ends[1].close()
                ends[0].send(b"\x01")
                self._waiting[pid] = ends[0]
            else:
                for end in ends:
                    end.close()
        elif data == SWITCH:
            channel = self._waiting.pop(pid, None)
            if channel is not None:
                self._channels.append(channel)
        else:
            for fd in fds:
                os.close(fd)
            self.datagrams.append(data)

    def _run(self):
        import select

        while self._running:
            if self._drop.is_set():
                for c in self._channels:
                    c.close()
                self._channels.clear()
                self._drop.clear()
            try:
                ready, _, _ = select.select([self.sock] + self._channels, [], [], 0.05)
            except (OSError, ValueError):
                return
            for r in ready:
                try:
                    if r is self.sock:
                        self._shared()
                        continue
                    data = r.recv(65536)
                except OSError:
                    continue
                if data:
                    self.datagrams.append(data)
                    self.on_channels += 1
                else:  # the process closed it
                    self._channels.remove(r)
                    r.close()

    def drop_channels(self):
        """Closes every channel it reads, as a profiler that takes no more would, and returns
        once it has."""
        self._drop.set()
        deadline = time.monotonic() + 5
        while self._drop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, settle=0.2):
        """Waits ``settle`` seconds for stragglers, stops, and returns the parsed markers."""
        time.sleep(settle)
        self._running = False
        self._thread.join()
        self.sock.close()
        for c in self._channels + list(self._waiting.values()):
            c.close()
        return [parse(d) for d in self.datagrams]


def load(socket_path, rank=None):
    """Re-imports stallscope as a process started with these variables would see it."""
    env = {"STALLSCOPE_SOCKET": socket_path, "RANK": rank}
    saved = {k: os.environ.get(k) for k in env}
    for open_socket in (stallscope._sock, stallscope._chan, stallscope._pending):
        if isinstance(open_socket, socket.socket):
            open_socket.close()
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        return importlib.reload(stallscope)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class MarkerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "markers.sock")

    def tearDown(self):
        load(None)
        self.dir.cleanup()

    def test_a_process_moves_to_its_own_channel_and_its_events_keep_their_order(self):
        # The shared socket queues 10 datagrams, so the profiler woke for each burst; a
        # process's own pair holds what its buffer holds, read ten times a second.
        receiver = Receiver(self.path)
        ss = load(self.path)
        for i in range(100):
            ss.step()
            if i < 3:
                time.sleep(0.05)  # a loop's first iterations: the profiler answers meanwhile
        markers = receiver.stop()
        self.assertEqual([m.seq for m in markers], list(range(100)))
        self.assertIsNotNone(ss._chan)
        # The first event, then one more while the profiler's answer came, on the shared socket.
        self.assertGreaterEqual(receiver.on_channels, 97)
        self.assertEqual(ss.dropped(), 0)

    def test_a_profiler_that_does_not_answer_leaves_the_process_on_the_shared_socket(self):
        receiver = Receiver(self.path, answer=False)
        ss = load(self.path)
        for _ in range(10):
            ss.step()
            time.sleep(0.05)
        markers = receiver.stop()
        self.assertEqual([m.seq for m in markers], list(range(10)))
        self.assertEqual(receiver.on_channels, 0)
        self.assertIsNone(ss._chan)
        self.assertIsNone(ss._pending, "closed unanswered: given up, twice")
        self.assertEqual(ss._channel_tries, ss._MAX_CHANNEL_TRIES)

    def test_a_channel_the_profiler_closes_leaves_the_process_on_the_shared_socket(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        for _ in range(10):
            ss.step()
            time.sleep(0.02)
        self.assertIsNotNone(ss._chan)
        receiver.drop_channels()  # the profiler drops it (too many, or stopped)
        for _ in range(10):
            ss.step()
            time.sleep(0.02)
        markers = receiver.stop()
        self.assertEqual([m.seq for m in markers], list(range(20)))

    def test_events_follow_the_wire_format(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        before = time.monotonic_ns()
        with ss.phase("data"):
            pass
        ss.step()
        ss.set_rank(3)
        ss.begin("compute")
        ss.end("compute")
        ss.begin("comm", t_ns=before)
        ss.meta(workers=2, pin_memory=True, framework="torch-2.1.0-cu121", path="/a/b")
        ss.step()
        markers = receiver.stop()

        got = [(m.seq, m.rank, m.iter, m.event, m.phase) for m in markers]
        self.assertEqual(
            got,
            [
                (0, -1, 0, "B", "data"),
                (1, -1, 0, "E", "data"),
                (2, -1, 0, "S", "iter"),
                (3, 3, 1, "B", "compute"),
                (4, 3, 1, "E", "compute"),
                (5, 3, 1, "B", "comm"),
                (6, 3, 1, "M", "-"),
                (7, 3, 1, "S", "iter"),
            ],
        )
        self.assertTrue(all(m.pid == os.getpid() for m in markers))
        self.assertEqual(markers[5].t_ns, before)
        times = [m.t_ns for m in markers if m.seq != 5]
        self.assertEqual(times, sorted(times))
        self.assertTrue(before <= times[0] <= times[-1] <= time.monotonic_ns())
        self.assertEqual(
            markers[6].fields,
            {"workers": "2", "pin_memory": "1", "framework": "torch-2.1.0-cu121", "path": "/a/b"},
        )
        self.assertEqual(ss.dropped(), 0)

    def test_a_communication_operation_names_itself_on_its_begin(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        ss._op_span("comm", 100, 250, "recv", 0, 7, 16384, peer=1)
        ss._op_span("comm", 300, 400, "all/reduce", 2, 0, 8)
        markers = receiver.stop()
        got = [(m.t_ns, m.event, m.phase, m.fields) for m in markers]
        self.assertEqual(
            got,
            [
                (100, "B", "comm", {"op": "recv", "g": "0", "n": "7", "b": "16384", "p": "1"}),
                (250, "E", "comm", {}),
                (300, "B", "comm", {"op": "all_reduce", "g": "2", "n": "0", "b": "8"}),
                (400, "E", "comm", {}),
            ],
        )
        self.assertEqual(ss.dropped(), 0)

    def test_rank_comes_from_the_environment(self):
        receiver = Receiver(self.path)
        ss = load(self.path, rank="5")
        ss.step()
        self.assertEqual(receiver.stop()[0].rank, 5)

    def test_names_and_fields_are_mapped_into_the_alphabet(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        ss.begin("my phase/1")
        ss.end("x" * 100)
        ss.meta(**{"bad key": "a b", "none": None, "long": "v" * 300, "": 1, "ok": "é/x"})
        ss.meta(**{"k{}".format(i): "v" * 200 for i in range(40)})  # over 4096 bytes
        ss.begin("")
        with ss.phase(""):
            pass
        markers = receiver.stop()  # parse() raises on anything marker.rs would reject
        self.assertEqual(markers[0].phase, "my_phase_1")
        self.assertEqual(markers[1].phase, "x" * 64)
        self.assertEqual(markers[2].fields, {"bad_key": "a_b", "long": "v" * 256, "ok": "_/x"})
        self.assertLess(len(receiver.datagrams[3]), 4096)
        self.assertGreater(len(markers[3].fields), 10)
        self.assertEqual(len(markers), 4)
        self.assertEqual(ss.dropped(), 3)  # begin("") and both events of phase("")

    def test_values_the_format_cannot_carry_are_not_sent(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        ss.begin("x", t_ns=-1)
        ss.begin("x", t_ns="soon")
        ss.set_rank(2**40)
        ss.step()
        ss.set_rank("two")
        ss.step()
        markers = receiver.stop()
        self.assertEqual([(m.seq, m.rank, m.event) for m in markers], [(0, -1, "S"), (1, -1, "S")])
        self.assertEqual(ss.dropped(), 2)

    def test_sequence_numbers_are_never_reused_across_threads(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        threads, per_thread = 4, 500

        def send():
            for _ in range(per_thread):
                ss.begin("t")
                time.sleep(0)

        workers = [threading.Thread(target=send) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seqs = [m.seq for m in receiver.stop()]
        total = threads * per_thread
        self.assertEqual(len(seqs), len(set(seqs)), "a sequence number was sent twice")
        self.assertTrue(set(seqs) <= set(range(total)))
        # Whatever the kernel's queue limit dropped is accounted for.
        self.assertEqual(len(seqs) + ss.dropped(), total)

    def test_a_forked_child_numbers_its_own_events(self):
        receiver = Receiver(self.path)
        ss = load(self.path, rank="1")
        ss.step()
        ss.step()
        pid = os.fork()
        if pid == 0:
            try:
                ss.begin("data")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        ss.step()
        markers = receiver.stop()
        child = [m for m in markers if m.pid == pid]
        parent = [m for m in markers if m.pid == os.getpid()]
        self.assertEqual([(m.seq, m.iter, m.rank) for m in child], [(0, 0, 1)])
        self.assertEqual([m.seq for m in parent], [0, 1, 2])

    def _assert_never_blocks_or_raises(self, ss, sends=10000):
        start = time.monotonic()
        for _ in range(sends // 4):
            ss.step()
            with ss.phase("data"):
                pass
            ss.meta(k="v")
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 2.0, "sends took {:.2f} s".format(elapsed))
        return elapsed

    def test_missing_socket_drops_without_raising(self):
        ss = load(self.path)
        self._assert_never_blocks_or_raises(ss)
        self.assertEqual(ss.dropped(), 10000)
        self.assertTrue(ss.enabled())

    def test_removed_socket_drops_without_raising(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        ss.step()
        receiver.stop(settle=0)
        os.unlink(self.path)
        self._assert_never_blocks_or_raises(ss)
        self.assertEqual(ss.dropped(), 10000)

    def test_stale_socket_file_drops_without_raising(self):
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stale.bind(self.path)
        stale.close()  # the file stays, nobody listens: ECONNREFUSED
        ss = load(self.path)
        self._assert_never_blocks_or_raises(ss)
        self.assertEqual(ss.dropped(), 10000)

    def test_full_socket_drops_without_blocking(self):
        unread = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unread.bind(self.path)
        try:
            ss = load(self.path)
            self._assert_never_blocks_or_raises(ss)
            queued = 0
            unread.setblocking(False)
            held, dropped = len(ss._held), ss.dropped()  # the flusher finds the socket full
            while True:
                try:
                    next_marker(unread)
                    queued += 1
                except BlockingIOError:
                    break
        finally:
            unread.close()
        self.assertGreater(queued, 0)
        self.assertEqual(held, ss._MAX_HELD)
        self.assertEqual(queued + held + dropped, 10000)

    def test_events_a_full_socket_refused_arrive_in_order_once_it_has_room(self):
        # A profiler descheduled for a moment (a loaded machine) leaves its socket full: a Unix
        # datagram socket queues 10. What it refused is held and goes first, in order, as
        # soon as a later event finds room; none is lost.
        unread = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unread.bind(self.path)
        unread.setblocking(False)
        received = []

        def drain():
            while True:
                try:
                    received.append(next_marker(unread))
                except BlockingIOError:
                    return

        try:
            ss = load(self.path)
            for _ in range(50):
                ss.step()
            self.assertEqual(ss.dropped(), 0)
            self.assertGreaterEqual(len(ss._held), 30)  # the socket took ~10
            for _ in range(20):  # the profiler reads again; the job goes on stepping
                drain()
                ss.step()
            deadline = time.monotonic() + 5  # the flusher thread may hold the last ones
            while ss._held and time.monotonic() < deadline:
                drain()
                time.sleep(0.001)
            drain()
        finally:
            unread.close()
        self.assertEqual(ss.dropped(), 0)
        self.assertFalse(ss._held)
        self.assertEqual([m.seq for m in received], list(range(70)))
        self.assertEqual([m.iter for m in received], list(range(70)))

    def test_events_held_while_the_training_sends_nothing_more_still_arrive(self):
        # A rank stuck in a collective sends nothing after its begin: if that begin met a full
        # socket, the hang would be reported at the rank's previous event. The flusher thread
        # sends what is held once the profiler reads again, with no further event.
        unread = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unread.bind(self.path)
        unread.setblocking(False)
        received = []
        try:
            ss = load(self.path)
            for _ in range(30):
                ss.step()
            ss.begin("comm")  # the last event before the "hang"
            self.assertTrue(ss._held)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the profiler reads; the training sends nothing
                try:
                    received.append(next_marker(unread))
                except BlockingIOError:
                    if len(received) == 31:
                        break
                    time.sleep(0.01)
        finally:
            unread.close()
        self.assertEqual([m.seq for m in received], list(range(31)))
        self.assertEqual((received[-1].event, received[-1].phase), ("B", "comm"))
        self.assertFalse(ss._held)
        self.assertEqual(ss.dropped(), 0)

    def test_a_fact_refused_by_a_full_socket_is_sent_after_the_next_step_that_finds_room(self):
        # DDP's bytes are said once; if that datagram meets a full socket (the profiler fell
        # behind), it must still arrive once the profiler catches up.
        unread = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unread.bind(self.path)
        unread.setblocking(False)
        try:
            ss = load(self.path)
            while True:  # fill the socket
                before = ss.dropped()
                ss.step()
                if ss.dropped() > before:
                    break
            ss.meta(comm_bytes=1235304, comm_buckets=2)  # the held events are too many
            ss.step()  # still full: nothing more is tried
            dropped = ss.dropped()
            self.assertEqual(dropped, before + 3)  # the step that filled it, the fact, a step
            later = []
            # The profiler catches up while the job steps, for up to 5 s: a step that finds
            # the flusher thread sending holds its event behind, so steps alone need not move.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                while True:
                    try:
                        later.append(next_marker(unread))
                    except BlockingIOError:
                        break
                if not ss._held and [m for m in later if m.event == "M"]:
                    break
                ss.step()
                time.sleep(0.0005)
        finally:
            unread.close()
        facts = [m.fields for m in later if m.event == "M"]
        self.assertEqual(facts, [{"comm_bytes": "1235304", "comm_buckets": "2"}])
        self.assertEqual(ss.dropped(), dropped)

    def test_send_errors_of_any_kind_are_counted(self):
        ss = load(self.path)

        class Broken:
            def sendto(self, data, address):
                raise ValueError("anything")

        ss._sock.close()
        ss._sock = Broken()
        ss.step()
        ss.meta(a=1)
        self.assertEqual(ss.dropped(), 2)

    def test_the_last_event_at_exit_says_how_many_before_it_were_lost(self):
        # A process that exits: its last event is M exit=1, numbered after every event it
        # tried to send, so that a reader sees the gap of events lost at the end.
        receiver = Receiver(self.path)
        script = "import stallscope\nfor _ in range(3):\n    stallscope.step()\n"
        env = dict(os.environ, STALLSCOPE_SOCKET=self.path, PYTHONPATH=PYTHON_DIR)
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
        markers = receiver.stop()
        self.assertEqual([(m.seq, m.event) for m in markers][-1], (3, "M"))
        self.assertEqual(markers[-1].fields, {"exit": "1"})

    def test_the_exit_event_waits_briefly_for_a_full_socket_and_then_gives_up(self):
        ss = load(self.path)

        class FullThenFree:
            def __init__(self, full):
                self.full, self.sent = full, []

            def sendto(self, data, address):
                if self.full > 0:
                    self.full -= 1
                    raise BlockingIOError()
                self.sent.append(parse(data))

        ss._sock.close()
        ss.step()  # dropped: nobody listens at self.path
        naps = []
        ss._sock = FullThenFree(3)
        ss._goodbye(sleep=naps.append)
        self.assertEqual(len(naps), 3)
        self.assertEqual([(m.seq, m.event) for m in ss._sock.sent], [(1, "M")])
        self.assertEqual(ss.dropped(), 1)
        # Full for longer than the patience: it gives up, counts the loss, and returns.
        ss._sock = FullThenFree(10**9)
        started = time.monotonic()
        ss._goodbye()
        self.assertLess(time.monotonic() - started, 5.0)
        self.assertEqual(ss.dropped(), 2)

    def test_without_a_socket_everything_is_a_no_op(self):
        ss = load(None)
        self.assertFalse(ss.enabled())
        with ss.phase("data"):
            ss.step()
            ss.meta(a=1)
            ss.begin("x")
            ss.end("x")
        self.assertEqual(ss.dropped(), 0)

    def test_an_agent_socket_is_used_only_from_a_directory_nobody_else_writes(self):
        # Issue 17, item 1: a socket another user could have planted is never joined.
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o700)
            self.assertTrue(stallscope._trusted_dir(tmp))
            os.chmod(tmp, 0o777)
            self.assertFalse(stallscope._trusted_dir(tmp), "others may write in it")
            os.chmod(tmp, 0o700)
            link = os.path.join(tmp, "link")
            os.symlink(tmp, link)
            self.assertFalse(stallscope._trusted_dir(link), "a symbolic link")
            if os.getuid() == 0:
                other = os.path.join(tmp, "other")
                os.mkdir(other, 0o700)
                os.chown(other, 65534, 65534)
                self.assertFalse(stallscope._trusted_dir(other), "another user's")
            old = os.environ.get("XDG_RUNTIME_DIR")
            try:
                os.environ["XDG_RUNTIME_DIR"] = tmp
                if os.getuid() != 0:
                    own = os.path.join(tmp, "stallscope")
                    os.mkdir(own, 0o777)
                    os.chmod(own, 0o777)
                    planted = Receiver(os.path.join(own, "agent.sock"))
                    try:
                        self.assertIsNone(stallscope._agent_socket(), "a world-writable directory")
                    finally:
                        planted.stop()
            finally:
                if old is None:
                    os.environ.pop("XDG_RUNTIME_DIR", None)
                else:
                    os.environ["XDG_RUNTIME_DIR"] = old

    def test_sending_is_cheap(self):
        receiver = Receiver(self.path)
        ss = load(self.path)
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            ss.step()
        per_event = (time.perf_counter() - start) / n
        receiver.stop(settle=0)
        self.assertLess(per_event, 50e-6, "{:.1f} us per event".format(per_event * 1e6))


if __name__ == "__main__":
    unittest.main()
