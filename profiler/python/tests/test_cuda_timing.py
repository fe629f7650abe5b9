"""Lazy read-back of CUDA events, with stand-in events on a scripted GPU clock (no CUDA here).

The stand-in behaves as a CUDA event on one stream: ``record()`` places it after the work
queued so far, ``query()`` is true once the GPU has reached it, and ``elapsed_time`` is only
valid between two completed events (it raises otherwise, as torch does).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stallscope._cuda_timing import LazyEventTimer  # noqa: E402


class Gpu:
    """One stream on a wall clock in ms: ``now`` is the CPU's time, ``queued`` when the work
    queued so far will be finished; the GPU has run up to ``done`` ms. A stream that has
    drained starts new work (and completes new events) at ``now``, not where it stopped."""

    def __init__(self):
        self.now = 0.0
        self.queued = 0.0
        self.done = 0.0
        self.records = 0

    def work(self, ms):
        self.queued = max(self.queued, self.now) + ms

    def wait(self, ms):
        """The CPU waits ``ms`` (for data) while the GPU goes on with its queue."""
        self.now += ms


class Event:
    def __init__(self, gpu):
        self.gpu = gpu
        self.at = None

    def record(self):
        self.gpu.records += 1
        self.at = max(self.gpu.queued, self.gpu.now)

    def query(self):
        return self.at is not None and self.gpu.done >= self.at

    def elapsed_time(self, other):
        if not (self.query() and other.query()):
            raise RuntimeError("event not complete")
        return other.at - self.at


class LazyReadbackTest(unittest.TestCase):
    def setUp(self):
        self.gpu = Gpu()
        self.sent = []
        self.created = 0

        def new_event():
            self.created += 1
            return Event(self.gpu)

        self.timer = LazyEventTimer(new_event, self.sent.append, max_pending=4)

    def iteration(self, i, compute_ms, comm_ms):
        self.gpu.work(compute_ms)
        self.timer.mark("bucket")
        self.gpu.work(comm_ms)
        self.timer.mark("backward_end")
        self.gpu.work(1.0)  # optimizer
        self.timer.step(i)

    def test_times_arrive_once_the_gpu_has_passed_them_and_never_before(self):
        # The CPU queues three iterations while the GPU has not finished the first.
        for i in range(3):
            self.iteration(i, compute_ms=10.0, comm_ms=4.0)
        self.assertEqual(self.sent, [], "nothing is read before the GPU is there")
        self.gpu.done = 15.0 + 15.0  # two iterations done on the GPU
        self.iteration(3, compute_ms=10.0, comm_ms=4.0)
        self.assertEqual([f["gpu_iter"] for f in self.sent], [0, 1])
        self.assertNotIn("gpu_iter_us", self.sent[0], "no previous step for the first")
        self.assertEqual(self.sent[1]["gpu_iter_us"], 15000)
        self.assertEqual(self.sent[1]["gpu_comm_us"], 4000)
        self.gpu.done = self.gpu.queued
        self.timer.poll()
        self.assertEqual([f["gpu_iter"] for f in self.sent], [0, 1, 2, 3])

    def test_events_are_reused_rather_than_created_each_iteration(self):
        for i in range(50):
            self.iteration(i, compute_ms=5.0, comm_ms=1.0)
            self.gpu.done = self.gpu.queued
            self.timer.poll()
        self.assertEqual(len(self.sent), 50)
        self.assertLess(self.created, 10, "a small pool serves every iteration")

    def test_a_gpu_that_falls_behind_costs_the_oldest_iterations_not_memory(self):
        for i in range(10):
            self.iteration(i, compute_ms=5.0, comm_ms=1.0)
        self.assertEqual(self.timer.dropped, 6)
        self.gpu.done = self.gpu.queued
        self.timer.poll()
        self.assertEqual([f["gpu_iter"] for f in self.sent], [6, 7, 8, 9])

    def test_an_iteration_without_ddp_buckets_has_no_comm_time(self):
        self.gpu.work(7.0)
        self.timer.step(0)
        self.gpu.work(7.0)
        self.timer.step(1)
        self.gpu.done = self.gpu.queued
        self.timer.poll()
        self.assertEqual(self.sent[1], {"gpu_iter": 1, "gpu_iter_us": 7000})


class DataWaitTest(unittest.TestCase):
    """``gpu_data_us``: how long the GPU sat idle while the loop waited for data."""

    def setUp(self):
        self.gpu = Gpu()
        self.sent = []
        self.timer = LazyEventTimer(lambda: Event(self.gpu), self.sent.append)

    def iteration(self, i, wait_ms, kernels_ms, waits=1):
        for _ in range(waits):
            self.timer.data_begin()
            self.gpu.wait(wait_ms)
            self.timer.data_end()
            self.gpu.work(kernels_ms)
        self.gpu.now += 1.0  # the CPU queues the kernels in 1 ms and does not wait for them
        self.timer.step(i)

    def drain(self):
        self.gpu.done = max(self.gpu.queued, self.gpu.now)
        self.timer.poll()

    def test_a_wait_the_gpu_spent_on_queued_kernels_costs_nothing(self):
        # The CPU runs ahead: each 30 ms wait for data overlaps 50 ms of the previous
        # iteration's kernels, so the GPU never idles; the CPU's data phase says 30 ms.
        for i in range(6):
            self.iteration(i, wait_ms=30.0, kernels_ms=50.0)
        self.drain()
        idle = [f["gpu_data_us"] for f in self.sent]
        self.assertEqual(idle[0], 30000, "before the first batch the GPU had nothing to do")
        self.assertEqual(idle[1:], [0] * 5)

    def test_a_wait_longer_than_the_queue_shows_the_difference(self):
        # 80 ms waits, 50 ms of kernels: an iteration lasts 81 ms on the CPU (the wait and
        # 1 ms of queueing), the GPU works 50 of them and idles 31, all inside the wait.
        for i in range(6):
            self.iteration(i, wait_ms=80.0, kernels_ms=50.0)
        self.drain()
        idle = [f["gpu_data_us"] for f in self.sent]
        self.assertEqual(idle[0], 80000)
        for us in idle[1:]:
            self.assertEqual(us, 31000)
        # Iteration time on the GPU: step to step, the CPU's 81 ms period.
        self.assertEqual({f["gpu_iter_us"] for f in self.sent[1:]}, {81000})

    def test_every_wait_of_an_iteration_counts(self):
        # Gradient accumulation: four micro-batches per optimizer step, each waiting 10 ms
        # while the previous micro-batch's 5 ms of kernels run; the first wait overlaps only
        # 4 ms of them (the CPU spent 1 ms queueing after the last micro-batch).
        for i in range(3):
            self.iteration(i, wait_ms=10.0, kernels_ms=5.0, waits=4)
            self.drain()
        self.assertEqual(self.sent[1]["gpu_data_us"], 6000 + 3 * 5000)

    def test_an_iteration_that_never_waited_sends_no_data_time(self):
        self.gpu.work(5.0)
        self.timer.step(0)
        self.drain()
        self.assertNotIn("gpu_data_us", self.sent[0])


if __name__ == "__main__":
    unittest.main()
