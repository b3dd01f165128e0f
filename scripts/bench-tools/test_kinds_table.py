"""Tests of kinds_table.py, bench-kinds' table (stdlib unittest; scripts/test runs them in the
host tier): medians, per-round ratios to ib_write_lat, their interval, and missing figures."""
import os
import sys
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kinds_table  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def row(lines, name):
    return [c.strip() for c in next(x for x in lines if x.startswith(f"| {name} |")).split("|")[1:-1]]


class Table(unittest.TestCase):
    def test_ratios_are_per_round_and_the_interval_needs_six_rounds(self):
        # the device 40 µs in every round; the trailer at 44, 48, ... (ratios 1.1 .. 1.5 +)
        fig = {}
        for r in range(7):
            fig[(64, "dev_write", r)] = (40.0, 100.0)
            fig[(64, "write", r)] = (40.0 * (1.1 + r / 10), 120.0 + r)
        lines = kinds_table.table(fig, "k", "rxe0", 7, 1000)
        w = row(lines, "WRITE, trailer polled in memory")
        self.assertEqual(w[1], f"{40.0 * 1.4:.2f}")       # median one-way
        self.assertEqual(w[2], "123.00")                 # median p99
        self.assertEqual(w[3], "1.400")                  # median ratio
        self.assertEqual(w[4], "1.10–1.70")              # n = 7: order statistics 1 and 7
        self.assertEqual(w[5], "1.10–1.70")
        self.assertEqual(w[6], "7")
        # a pattern with no figure at all, and one whose rounds lack the device's
        self.assertEqual(row(lines, "told, then RDMA READ pull")[1:], ["–"] * 5 + ["0"])
        few = kinds_table.table({(64, "imm", 0): (50.0, None)}, "k", "rxe0", 1, 1000)
        self.assertEqual(row(few, "WRITE WITH IMM, CQ + re-post (today's)")[1:],
                         ["50.00", "–", "–", "–", "–", "1"])

    def test_two_rounds_give_no_interval(self):
        fig = {(4096, "dev_write", r): (200.0, None) for r in (0, 1)}
        fig.update({(4096, "send", r): (220.0 + 20 * r, None) for r in (0, 1)})
        s = row(kinds_table.table(fig, "k", "rxe0", 2, 1000), "SEND into posted buffers + copy")
        self.assertEqual(s[3:6], ["1.150", "–", "1.10–1.20"])


class Plot(unittest.TestCase):
    def test_a_dot_per_figure_placed_by_its_ratio(self):
        fig = {}
        for r in range(6):
            for size, dev in ((64, 20.0), (4096, 100.0)):
                fig[(size, "dev_write", r)] = (dev, None)
                fig[(size, "write", r)] = (dev * (0.95 + r / 100), None)
                fig[(size, "imm", r)] = (dev * 1.2, None)
                fig[(size, "read", r)] = (dev * 6, None)
        fig[(64, "mailbox", 0)] = (57.0, None)
        text = kinds_table.svg(fig, "t")
        root = ET.fromstring(text)
        dots = {(c.get("data-size"), c.get("data-pattern")): (float(c.get("data-ratio")), float(c.get("cx")))
                for c in root.iter(SVG + "circle") if c.get("class") == "median"}
        self.assertEqual(set(dots), {(s, p) for s in ("64", "4096") for p in ("write", "imm", "read")} |
                         {("64", "mailbox")})
        self.assertAlmostEqual(dots[("64", "imm")][0], 1.2)
        self.assertAlmostEqual(dots[("64", "mailbox")][0], 57.0 / 20)
        # (one panel: the further right, the slower; the two sizes side by side)
        xs = [dots[("64", p)][1] for p in ("write", "imm", "mailbox", "read")]
        self.assertEqual(xs, sorted(xs))
        self.assertGreater(dots[("4096", "write")][1], dots[("64", "read")][1])
        # the device's line and the target's are drawn in each panel
        ticks = [t for t in root.iter(SVG + "line") if t.get("class") == "tick"]
        self.assertEqual(sum(1 for t in ticks if t.get("stroke") == "black"), 2)
        self.assertEqual(sum(1 for t in ticks if t.get("stroke") == "#d62728"), 2)
        # a size with no figure of a pattern says so; no figures at all: no plot
        self.assertIn("no figure", text)
        self.assertIsNone(kinds_table.svg({}, "t"))


if __name__ == "__main__":
    unittest.main()
