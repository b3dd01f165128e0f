"""Tests of shm_pingpong.c, the same-host floor (stdlib unittest): it is built with the
machine's C compiler and run for a moment; the tool checks each answer's first and last words
against the message it sent, so a run that reports a latency carried every message back whole
and in order."""

import json
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ctool import CTool  # noqa: E402


@unittest.skipUnless(shutil.which("cc") and os.uname().machine == "x86_64", "needs cc on x86-64")
class ShmPingpong(CTool, unittest.TestCase):
    SOURCE = "shm_pingpong.c"
    FLAGS = ()

    def run_tool(self, *args):
        return subprocess.run([self.exe, *map(str, args)], capture_output=True, text=True, timeout=60)

    def test_reports_one_way_latency_as_sockbench_does(self):
        for size in (64, 4096, 65536):
            r = self.run_tool(size, 0.2, 0.05)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = json.loads(r.stdout)
            self.assertEqual(set(got), {"p50_us", "p99_us", "samples", "tsc"})
            self.assertGreater(got["samples"], 0)
            self.assertGreater(got["p50_us"], 0)
            self.assertGreaterEqual(got["p99_us"], got["p50_us"])

    def test_laps_the_ring_without_losing_a_message(self):
        # 65,000-byte messages lap the 1 MiB ring every ~16 round trips, and straddle its end
        # (split copies both ways); the writer looks at the reader's tail again once a lap, and
        # a message written over unread bytes, or put together wrongly, fails the tool's check
        r = self.run_tool(65000, 0.3, 0)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreater(json.loads(r.stdout)["samples"], 16)

    def test_refuses_bad_arguments(self):
        for args in ((), (4, 1), (70000, 1), (64, 0)):
            r = self.run_tool(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))


if __name__ == "__main__":
    unittest.main()
