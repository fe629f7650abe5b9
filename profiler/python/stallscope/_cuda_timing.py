"""GPU-side phase times from CUDA events, read back lazily: no synchronisation is added.

On CUDA the training loop's CPU thread runs ahead of the GPU, so the CPU-side markers say when
work was *queued*, not when it ran. This module records CUDA events on the current stream at
the points the hook already sees (each DDP gradient bucket ready, ``backward()`` returning, the
optimizer step), and reads them back only once ``event.query()`` says the GPU has passed them,
a few iterations later. Nothing here waits on the GPU: an iteration whose events are not done
stays pending, and after ``MAX_PENDING`` pending iterations the oldest is dropped and counted.

Per completed iteration one ``M`` marker is sent with:

* ``gpu_iter``: the iteration number (the one ``S`` carried);
* ``gpu_iter_us``: µs on the GPU from the previous step's event to this one;
* ``gpu_data_us``: µs the GPU sat idle while the loop waited for data: for each wait, an event
  recorded as the wait begins and one as it ends, with no work queued between them, lie
  ``max(0, wait end - max(wait begin, the GPU finishing its queue))`` apart; summed over the
  iteration's waits. A wait the GPU spent draining queued kernels costs nothing and counts
  nothing; left out when the iteration had no wait;
* ``gpu_comm_us``: µs on the GPU from the last gradient bucket ready to ``backward()``
  returning: the exposed gradient all-reduce as the GPU saw it (DDP makes the stream wait for
  the all-reduce before backward returns); left out when the iteration had no DDP buckets.

Once CUDA is initialised, one ``M`` marker also tells which device this process drives:
``cuda_device`` (the CUDA index), ``cuda_visible`` (``CUDA_VISIBLE_DEVICES`` with ``:`` in place
of commas) and ``gpu_uuid`` (``GPU-…`` where torch exposes it), so stallscope can find its
NVML device. Every entry point catches everything: the trainer never sees an error from here.
"""

import os

import stallscope

MAX_PENDING = 16
# Data waits timed per iteration at most (gradient accumulation waits once per micro-batch);
# later ones in the same iteration are not timed.
MAX_DATA_WAITS = 64


class LazyEventTimer:
    """Per-iteration CUDA events, turned into times once the GPU has passed them.

    ``new_event()`` returns an object with ``record()``, ``query()`` and
    ``elapsed_time(other)`` (ms), as ``torch.cuda.Event(enable_timing=True)`` does; ``send``
    takes the fields of one ``M`` marker.
    """

    def __init__(self, new_event, send, max_pending=MAX_PENDING):
        self._new_event = new_event
        self._send = send
        self._max_pending = max_pending
        self._free = []  # events whose times were read, for reuse
        self._current = {}  # name -> event, for the iteration under way
        self._waits = []  # [begin, end or None] per data wait of the iteration under way
        self._pending = []  # (iteration, {name: event}, waits), oldest first
        self._previous_step = None  # the last step event read back, for gpu_iter_us
        self.dropped = 0

    def _event(self, name):
        event = self._current.get(name)
        if event is None:
            event = self._new()
            self._current[name] = event
        return event

    def mark(self, name):
        """Records event ``name`` now on the current stream (again: the latest record wins)."""
        self._event(name).record()

    def _new(self):
        return self._free.pop() if self._free else self._new_event()

    def data_begin(self):
        """The loop starts waiting for data."""
        if len(self._waits) < MAX_DATA_WAITS and not (self._waits and self._waits[-1][1] is None):
            event = self._new()
            event.record()
            self._waits.append([event, None])

    def data_end(self):
        """The loop has its data (or gave up waiting): closes the open wait."""
        if self._waits and self._waits[-1][1] is None:
            event = self._new()
            event.record()
            self._waits[-1][1] = event

    def step(self, iteration):
        """Closes ``iteration`` with a step event and reads back whatever the GPU has passed."""
        self.mark("step")
        closed = [w for w in self._waits if w[1] is not None]
        self._waits = [w for w in self._waits if w[1] is None]  # a wait across the step
        self._pending.append((iteration, self._current, closed))
        self._current = {}
        while len(self._pending) > self._max_pending:
            _, events, waits = self._pending.pop(0)
            self._recycle(events, waits)
            self.dropped += 1
        self.poll()

    def poll(self):
        """Sends the times of every pending iteration the GPU is done with, oldest first."""
        while self._pending:
            iteration, events, waits = self._pending[0]
            if not all(e.query() for e in events.values()):
                return  # later iterations come later in stream order; so do their waits
            self._pending.pop(0)
            step = events["step"]
            fields = {"gpu_iter": iteration}
            if self._previous_step is not None:
                fields["gpu_iter_us"] = int(self._previous_step.elapsed_time(step) * 1000)
            bucket, done = events.get("bucket"), events.get("backward_end")
            if bucket is not None and done is not None:
                fields["gpu_comm_us"] = int(max(0.0, bucket.elapsed_time(done)) * 1000)
            if waits:
                idle_ms = sum(max(0.0, begin.elapsed_time(end)) for begin, end in waits)
                fields["gpu_data_us"] = int(idle_ms * 1000)
            self._send(fields)
            self._recycle(events, waits)

    def _recycle(self, events, waits):
        """Returns an iteration's events to the pool; its step event becomes the previous one."""
        for pair in waits:
            self._free.extend(pair)
        step = events.pop("step", None)
        self._free.extend(events.values())
        if step is not None:
            if self._previous_step is not None:
                self._free.append(self._previous_step)
            self._previous_step = step


_timer = None  # None: not decided yet; False: no CUDA in this process


def _timer_now():
    """The process's timer once CUDA is initialised (never initialises CUDA itself)."""
    global _timer
    if _timer is not None:
        return _timer or None
    try:
        import torch

        if not torch.cuda.is_available():
            _timer = False
            return None
        if not torch.cuda.is_initialized():
            return None  # the program has not touched CUDA yet; ask again next time
        _device_meta(torch)
        _timer = LazyEventTimer(
            lambda: torch.cuda.Event(enable_timing=True), lambda f: stallscope.meta(**f)
        )
        return _timer
    except Exception:
        _timer = False
        return None


def _device_meta(torch):
    device = torch.cuda.current_device()
    uuid = None
    try:
        uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        pass  # torch < 2.1 has no uuid
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    stallscope.meta(
        cuda_device=device,
        cuda_visible=visible.replace(",", ":") if visible else None,
        gpu_uuid=uuid,
    )


def _on_timer(method, *args):
    """Calls ``method`` of the process's timer, if it times; never raises."""
    try:
        timer = _timer_now()
        if timer is not None:
            getattr(timer, method)(*args)
    except Exception:
        pass


def on_bucket():
    """A DDP gradient bucket is ready (the last one before backward returns counts)."""
    _on_timer("mark", "bucket")


def on_data_begin():
    """The loop starts waiting in the DataLoader."""
    _on_timer("data_begin")


def on_data_end():
    """The DataLoader returned (a batch, or the end of the epoch)."""
    _on_timer("data_end")


def on_backward_end():
    """``backward()`` returned after DDP buckets were ready."""
    _on_timer("mark", "backward_end")


def on_step(iteration):
    """The optimizer step closed ``iteration``."""
    _on_timer("step", iteration)
