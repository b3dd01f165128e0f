"""Tests of ab-turns and sockbench's turns (stdlib unittest): two kernel-TCP ping-pongs over
loopback (nothing preloaded) take turns, and the tool pairs their turns."""

import os
import re
import shutil
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "ab-turns")


@unittest.skipUnless(shutil.which("cc") and shutil.which("taskset") and (os.cpu_count() or 1) >= 2,
                     "needs cc, taskset and two CPUs")
class AbTurns(unittest.TestCase):
    def run_tool(self, *args, **env):
        return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})

    def test_pairs_every_turn_after_the_warm_up(self):
        r = self.run_tool("-", "-", 60, 5, WARMUP_TURNS="2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("60 pairs of 5 ms turns", r.stdout)
        for v in "AB":
            self.assertRegex(r.stdout, rf"{v} median \d+\.\d+ µs one way")
        m = re.search(r"B/A median (\d+\.\d+) \(95% interval (\d+\.\d+)-(\d+\.\d+) over 6 blocks of 10; B faster in (\d+) of 60\)",
                      r.stdout)
        self.assertIsNotNone(m, r.stdout)
        med, lo, hi = map(float, m.groups()[:3])
        self.assertLessEqual(lo, med)
        self.assertLessEqual(med, hi)
        # (the same thing twice, paired turn by turn: the ratio is near 1 however the host is)
        self.assertGreater(med, 0.5)
        self.assertLess(med, 2.0)

    def test_refuses_bad_arguments(self):
        for args in ((), ("-",), ("-", "/nonexistent"), ("-", "-", "x"), ("-", "-", 1), ("-", "-", 4, 0)):
            r = self.run_tool(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))


if __name__ == "__main__":
    unittest.main()
