"""The comm hook's guard against a process group destroyed too soon (no torch needed)."""

import os
import threading
import time
import unittest

from test_markers import PYTHON_DIR  # noqa: F401  (puts the package on sys.path)

from stallscope import _comm_release


class CommReleaseTest(unittest.TestCase):
    def setUp(self):
        _comm_release._alive.clear()
        _comm_release.new_backward()

    def test_a_callback_counts_until_released(self):
        callback = _comm_release.Counted(lambda fut: fut * 2)
        self.assertEqual(callback(21), 42)
        self.assertEqual(len(_comm_release._alive), 1)
        del callback
        self.assertEqual(len(_comm_release._alive), 0)

    def test_the_wait_ends_when_another_thread_releases_the_last_callback(self):
        held = [_comm_release.Counted(lambda fut: fut)]
        releaser = threading.Timer(0.05, held.clear)
        releaser.start()
        start = time.monotonic()
        self.assertTrue(_comm_release.wait_for_release(patience_s=5))
        self.assertLess(time.monotonic() - start, 4)
        releaser.join()

    def test_the_wait_is_bounded(self):
        held = _comm_release.Counted(lambda fut: fut)
        start = time.monotonic()
        self.assertFalse(_comm_release.wait_for_release(patience_s=0.05))
        self.assertLess(time.monotonic() - start, 2)
        del held

    def test_kept_objects_live_until_the_next_backward(self):
        class Tensor:
            pass

        import weakref

        tensor = Tensor()
        ref = weakref.ref(tensor)
        _comm_release.keep(tensor)
        del tensor
        self.assertIsNotNone(ref())
        _comm_release.new_backward()
        self.assertIsNone(ref())

    def test_settling_waits_only_in_a_process_that_relayed_a_module(self):
        guarded = _comm_release._exit_guarded
        try:
            _comm_release._exit_guarded = False
            start = time.monotonic()
            _comm_release.settle()
            self.assertLess(time.monotonic() - start, _comm_release.SETTLE_S)
            _comm_release._exit_guarded = True
            start = time.monotonic()
            _comm_release.settle()
            self.assertGreaterEqual(time.monotonic() - start, _comm_release.SETTLE_S)
        finally:
            _comm_release._exit_guarded = guarded

    def test_without_a_new_backward_the_kept_objects_stay_bounded(self):
        for i in range(10 * _comm_release.MAX_KEPT):
            _comm_release.keep(i)
        self.assertLessEqual(len(_comm_release._kept), _comm_release.MAX_KEPT)
        self.assertEqual(_comm_release._kept[-1], 10 * _comm_release.MAX_KEPT - 1)

    def test_a_forked_child_waits_for_no_callback_of_its_parent(self):
        held = _comm_release.Counted(lambda fut: fut)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not _comm_release._alive else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        del held


if __name__ == "__main__":
    unittest.main()
