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
    """One stream: work is queued in ms; the GPU has run up to ``done`` ms."""

    def __init__(self):
        self.queued = 0.0
        self.done = 0.0
        self.records = 0

    def work(self, ms):
        self.queued += ms


class Event:
    def __init__(self, gpu):
        self.gpu = gpu
        self.at = None

    def record(self):
        self.gpu.records += 1
        self.at = self.gpu.queued

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


if __name__ == "__main__":
    unittest.main()
