"""Tests of scale_plot.py, bench-scale's plot (stdlib unittest; scripts/test runs them in the
host tier): what each line holds, and an SVG that parses with a point per figure."""
import json
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_plot  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def row(n, up, pinned, rss, rss_tcp, decided, burst, burst_tcp):
    return {"n": n, "client_upgraded": up, "server_upgraded": up, "decided_after_s": decided,
            "client_pinned_kib": pinned * up, "server_pinned_kib": pinned * up,
            "rss_kib": {"client": {"shim": rss, "tcp": rss_tcp}, "server": {"shim": rss, "tcp": rss_tcp}},
            "burst_ms": {"shim": burst, "tcp": burst_tcp}}


RESULTS = {"local": False, "ring_kib": 512, "rows": [
    row(100, 100, 76, 40_000, 6_000, 1.9, 1_200, 600),
    row(1000, 1000, 76, 300_000, 9_000, 8.8, 7_100, 2_300),
    # a burst whose upgrades were not all decided: no such point, the others stay
    dict(row(10000, 9940, 76, 2_600_000, 40_000, None, 109_000, 14_000), decided_after_s=None),
]}


class Lines(unittest.TestCase):
    def test_memory_is_per_upgraded_connection_and_resident_is_more_than_tcps(self):
        memory, time = scale_plot.series(RESULTS["rows"])
        m = dict(memory)
        self.assertEqual(m["pinned, client"], [(100, 76.0), (1000, 76.0), (10000, 76.0)])
        self.assertEqual(m["resident more than TCP's, server"][0], (100, (40_000 - 6_000) / 100))
        self.assertAlmostEqual(m["resident more than TCP's, client"][2][1], (2_600_000 - 40_000) / 9940)
        t = dict(time)
        self.assertEqual(t["all decided after the burst (shim)"], [(100, 1.9), (1000, 8.8)])
        self.assertEqual(t["the burst itself, kernel TCP"], [(100, 0.6), (1000, 2.3), (10000, 14.0)])

    def test_the_upgraded_share_of_each_burst_is_noted(self):
        notes = scale_plot.upgraded_notes(RESULTS["rows"])
        self.assertEqual(notes, {100: "upgraded 100%", 1000: "upgraded 100%", 10000: "upgraded 99.4%"})
        self.assertEqual(scale_plot.upgraded_notes([dict(RESULTS["rows"][0], server_upgraded=90)]),
                         {100: "upgraded 100% / 90%"})

    def test_a_run_without_tcp_figures_has_no_resident_line(self):
        rows = [dict(r, rss_kib={"client": {"shim": 1, "tcp": None}, "server": {}}) for r in RESULTS["rows"]]
        memory, _ = scale_plot.series(rows)
        self.assertEqual(dict(memory)["resident more than TCP's, client"], [])


class Svg(unittest.TestCase):
    def test_the_file_parses_with_a_point_per_figure(self):
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "results.json"), os.path.join(d, "scale.svg")
            with open(src, "w") as f:
                json.dump(RESULTS, f)
            self.assertEqual(scale_plot.main(["scale_plot.py", src, out]), 0)
            root = ET.parse(out).getroot()
        points = root.findall(f"{SVG}circle")
        # memory: 4 lines x 3 bursts; time: 2 of the bursts decided, 3 + 3 bursts' times
        self.assertEqual(len(points), 12 + 2 + 3 + 3)
        self.assertEqual(len(root.findall(f"{SVG}polyline")), 7)
        texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
        self.assertIn("emulated", texts)
        self.assertIn("Memory per upgraded connection", texts)

    def test_no_rows_still_gives_a_picture_that_says_so(self):
        root = ET.fromstring(scale_plot.svg({"local": True, "rows": []}))
        texts = [t.text for t in root.iter(f"{SVG}text")]
        self.assertEqual(texts.count("no figures"), 2)
        self.assertIn("real figures", " ".join(t or "" for t in texts))


if __name__ == "__main__":
    unittest.main()
