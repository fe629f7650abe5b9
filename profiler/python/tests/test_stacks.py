"""The stack dump on request (``stallscope._stacks``): a signal dumps every thread, and one
that comes while the process exits (the dump already unregistered, as Python's finalization
does) does not end it."""

import os
import subprocess
import sys
import tempfile
import unittest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import faulthandler, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from stallscope import _stacks
_stacks.install()
number = int(signal.SIGRTMIN) + 5
def waiting_here():
    os.kill(os.getpid(), number)
    time.sleep(0.3)
waiting_here()
# What finalization does, then a request that comes too late.
faulthandler.unregister(number)
os.kill(os.getpid(), number)
time.sleep(0.3)
print("survived")
"""


class StacksTest(unittest.TestCase):
    def test_a_signal_dumps_the_stacks_and_a_late_one_does_not_end_the_process(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, STALLSCOPE_SOCKET=os.path.join(d, "run.sock"))
            done = subprocess.run(
                [sys.executable, "-c", CHILD, PYTHON_DIR],
                env=env,
                capture_output=True,
                timeout=60,
            )
            self.assertEqual(done.returncode, 0, done)
            self.assertIn(b"survived", done.stdout)
            dumps = [f for f in os.listdir(d) if f.startswith("stacks.")]
            self.assertEqual(len(dumps), 1, dumps)
            with open(os.path.join(d, dumps[0])) as f:
                text = f.read()
            self.assertIn("most recent call first", text)
            self.assertIn("waiting_here", text)


if __name__ == "__main__":
    unittest.main()
