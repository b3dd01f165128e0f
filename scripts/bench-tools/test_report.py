"""Tests of report.py's statistics and of its outputs on a synthetic run (stdlib unittest;
scripts/test runs them in the host tier)."""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def binom_tail(n, k):
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


class MedianInterval(unittest.TestCase):
    def test_too_few_values_have_no_95_interval(self):
        # n = 5: even (min, max) covers the median with 1 - 2/32 = 93.75% < 95%
        for n in range(6):
            self.assertIsNone(report.median_interval(list(range(n))), n)

    def test_order_statistics_and_coverage(self):
        # n = 12: (3rd, 10th) covers 1 - 2 P(B <= 2) = 96.1%; (4th, 9th) would be 85.4%
        lo, hi, cover = report.median_interval([float(x) for x in range(12, 0, -1)])
        self.assertEqual((lo, hi), (3.0, 10.0))
        self.assertAlmostEqual(cover, 1 - 2 * binom_tail(12, 2))
        self.assertGreaterEqual(cover, 0.95)
        self.assertLess(1 - 2 * binom_tail(12, 3), 0.95)

    def test_every_n_is_the_tightest_interval_at_95(self):
        for n in range(6, 60):
            lo, hi, cover = report.median_interval(list(range(1, n + 1)))
            k = lo  # values are 1..n, so the low end is its own rank
            self.assertEqual(hi, n + 1 - k)
            self.assertGreaterEqual(cover, 0.95)
            if k + 1 <= n // 2:
                self.assertLess(1 - 2 * binom_tail(n, k), 0.95, n)


def write_raw(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write("\t".join(map(str, r)) + "\n")


class AxisStep(unittest.TestCase):
    def test_one_two_five_steps_of_at_most_six(self):
        for top, want in [(1.0, 0.2), (5.9, 1.0), (6.1, 2.0), (12.0, 2.0), (13.0, 5.0),
                          (30.0, 5.0), (31.0, 10.0), (0.05, 0.01), (850.0, 200.0)]:
            step = report.step_125(top)
            self.assertTrue(math.isclose(step, want), (top, step, want))
            self.assertLessEqual(top / step, 6 + 1e-9)


class LatencyRounds(unittest.TestCase):
    def rounds(self, dev, shim, failed_shim=()):
        ok = {("device", "lr_devlat_64", "p50_us"): dict(enumerate(dev, 1)),
              ("shim", "lr_pingpong_64", "p50_us"): {r: v for r, v in enumerate(shim, 1)
                                                     if r not in failed_shim}}
        failed = {("shim", "lr_pingpong_64"): [(r, "boom") for r in failed_shim]}
        return report.latency_rounds(ok, failed)

    def test_ratios_pair_by_round_and_skip_failed_rounds(self):
        dev = [40.0] * 8
        shim = [40.0, 44.0, 48.0, 36.0, 42.0, 45.0, 40.0, 400.0]
        (e,) = self.rounds(dev, shim, failed_shim=(8,))
        self.assertEqual((e["rounds"], e["pairs"]), (8, 7))
        self.assertEqual([p["round"] for p in e["per_round"]], list(range(1, 8)))
        self.assertAlmostEqual(e["median"], 42.0 / 40.0)
        self.assertEqual(e["at_or_below_target"], 6)   # all but 48 / 40
        self.assertEqual(e["failed"], [{"system": "shim", "round": 8, "error": "boom"}])

    def test_verdicts(self):
        dev = [40.0] * 12
        meets = self.rounds(dev, [40.0 + i / 2 for i in range(12)])[0]      # 1.00-1.14x
        self.assertLessEqual(meets["interval"]["high"], report.LAT_TARGET)
        self.assertTrue(meets["verdict"].startswith("meets"), meets["verdict"])
        misses = self.rounds(dev, [50.0 + i for i in range(12)])[0]         # 1.25-1.53x
        self.assertGreater(misses["interval"]["low"], report.LAT_TARGET)
        self.assertTrue(misses["verdict"].startswith("misses"), misses["verdict"])
        spans = self.rounds(dev, [30.0 + 5 * i for i in range(12)])[0]      # 0.75-2.1x
        self.assertTrue(spans["verdict"].startswith("not resolved"), spans["verdict"])
        few = self.rounds(dev[:3], [40.0] * 3)[0]
        self.assertIsNone(few["interval"])
        self.assertIn("too few rounds", few["verdict"])

    def test_fast_runs_compare_lower_quartiles(self):
        # device fast in rounds 1-3, shim fast in rounds 10-12: paired ratios are extreme, the
        # lower quartiles (each side's fast runs) are equal
        dev = [20.0] * 3 + [50.0] * 9
        shim = [50.0] * 9 + [20.0] * 3
        (e,) = self.rounds(dev, shim)
        self.assertAlmostEqual(e["fast_ratio"], 1.0)
        self.assertAlmostEqual(e["min"], 0.4)
        self.assertAlmostEqual(e["max"], 2.5)


class ShimLabel(unittest.TestCase):
    def test_the_label_names_the_rings_that_carried_the_bytes(self):
        base = {"records": 2, "upgraded": 2, "fallback": 0, "reasons": {}}
        self.assertEqual(report.shim_label({**base, "rdma": 10, "shm": 0}),
                         ("rdmashim (2 of 2 connections upgraded, over RDMA)", "upgraded"))
        self.assertEqual(report.shim_label({**base, "rdma": 0, "shm": 10})[0],
                         "rdmashim (2 of 2 connections upgraded, over shared memory)")
        self.assertEqual(report.shim_label({**base, "fallback": 1, "rdma": 5, "shm": 5}),
                         ("rdmashim (2 of 3 connections upgraded, over RDMA and shared memory: mixed)",
                          "mixed"))
        self.assertEqual(report.shim_label({**base, "upgraded": 0, "fallback": 2})[1], "pass-through")


class WholeReport(unittest.TestCase):
    def test_outputs_carry_the_rounds(self):
        with tempfile.TemporaryDirectory() as d:
            raw, meta, stats, out = (os.path.join(d, x) for x in ("raw.tsv", "meta.txt", "stats", "out"))
            os.mkdir(stats)
            rows = [(1, "device", "devlat_64", "p50_us", 40), (1, "shim", "pingpong_64", "p50_us", 44),
                    (1, "rsocket", "sockperf_64", "failed", "exit 7: ERROR: sendto() Failed (errno=106 x)")]
            for r in range(1, 9):
                rows += [(r, "device", "lr_devlat_64", "p50_us", 40 + r),
                         (r, "shim", "lr_pingpong_64", "p50_us", 44 + r),
                         (r, "shim", "lr_sockperf_64", "p50_us", 46 + r)]
            write_raw(raw, rows)
            with open(meta, "w") as f:
                f.write("date=2026-11-23 00:00 UTC\nruns=1\nlat_rounds=8\n")
            devnull = open(os.devnull, "w")
            saved, sys.stdout = sys.stdout, devnull
            try:
                report.main(raw, stats, meta, out)
            finally:
                sys.stdout = saved
                devnull.close()
            with open(os.path.join(out, "results.json")) as f:
                res = json.load(f)
            tools = [e["test"] for e in res["latency_rounds"]]
            self.assertEqual(tools, ["lr_pingpong_64", "lr_sockperf_64"])
            self.assertEqual(res["latency_rounds"][0]["pairs"], 8)
            with open(os.path.join(out, "results.md")) as f:
                md = f.read()
            self.assertIn("## 64 B latency against the device, 8 short rounds", md)
            self.assertIn("| send/recv ping-pong | 8 of 8 |", md)
            for f in ("latency.svg", "throughput.svg", "app.svg"):
                self.assertTrue(os.path.getsize(os.path.join(out, f)) > 0, f)


if __name__ == "__main__":
    unittest.main()
