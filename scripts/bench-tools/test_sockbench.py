"""Tests of sockbench.c's ping-pong report (stdlib unittest): the tool is built with the
machine's C compiler and run for a moment over loopback TCP, nothing preloaded."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ctool import CTool  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(shutil.which("cc"), "needs cc")
class PingPong(CTool, unittest.TestCase):
    SOURCE = "sockbench.c"
    FLAGS = ("-pthread",)

    def pingpong(self, secs, env=None):
        port = free_port()
        server = subprocess.Popen(
            [self.exe, "server", "127.0.0.1", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.02)
            r = subprocess.run(
                [self.exe, "client", "127.0.0.1", str(port), "pp", "64", str(secs), "0"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **(env or {})},
            )
        finally:
            server.kill()
            server.wait()
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_slices_are_the_medians_of_the_run_in_order(self):
        got = self.pingpong(0.4, {"SOCKBENCH_SLICE_MS": "50"})
        slices = got["slices_us"]
        # (the counted run's round trips add up to its 0.4 s, less the loop's own time)
        self.assertGreaterEqual(len(slices), 4, got)
        self.assertLessEqual(len(slices), 9, got)
        self.assertTrue(all(s > 0 for s in slices), got)
        # the run's median lies between the slices' (at least half of every slice's round
        # trips are at most its median)
        self.assertLessEqual(min(slices), got["p50_us"] + 0.001, got)
        self.assertGreaterEqual(max(slices), got["p50_us"] - 0.001, got)

    def test_no_slices_unless_asked(self):
        got = self.pingpong(0.1)
        self.assertEqual(set(got), {"p50_us", "p99_us", "samples", "tsc", "cpu_us"})


if __name__ == "__main__":
    unittest.main()
