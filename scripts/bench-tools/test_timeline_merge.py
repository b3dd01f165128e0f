"""Tests of timeline_merge.py, the shim's two ends of a ping-pong put together (stdlib
unittest; scripts/test runs them in the host tier): the files it reads and each segment's
median and mean, the wire paired across the ends and the client's next post one round on."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline_merge  # noqa: E402


def end_file(d, name, marks, rate=(1000, 2000)):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(f"rate {rate[0]} {rate[1]}\n")
        for k, v in marks.items():
            f.write(" ".join([k] + [str(t) for t in v]) + "\n")
    return path


class Merge(unittest.TestCase):
    def test_segments_of_a_regular_ping_pong(self):
        # 2000 ticks per µs (2000 ticks over 1000 ns); a round trip every 100 µs: the client
        # posts at 0, its post returns at 20, the server sees it at 30, reads at 32, posts at
        # 35 (returns 50), the client sees the answer at 70, reads at 73, posts again at 100
        us = 2000
        rounds = range(5)
        c = {
            "post_called": [(100 * i) * us for i in rounds],
            "post_returned": [(100 * i + 20) * us for i in rounds],
            "data_seen": [(100 * i + 70) * us for i in rounds],
            "read_returned": [(100 * i + 73) * us for i in rounds],
        }
        s = {
            "post_called": [(100 * i + 35) * us for i in rounds],
            "post_returned": [(100 * i + 50) * us for i in rounds],
            "data_seen": [(100 * i + 30) * us for i in rounds],
            "read_returned": [(100 * i + 32) * us for i in rounds],
        }
        with tempfile.TemporaryDirectory() as d:
            (cm, rc) = timeline_merge.load(end_file(d, "c", c))
            (sm, rs) = timeline_merge.load(end_file(d, "s", s))
        self.assertEqual((rc, rs), (us, us))
        got = dict(timeline_merge.segments(cm, sm, us))
        want = {
            "post call (client)": 20,
            "wire: client post -> server sees it": 30,
            "server: seen -> read returns": 2,
            "server: read returns -> its post": 3,
            "post call (server)": 15,
            "wire: server post -> client sees it": 35,
            "client: seen -> read returns": 3,
            "client: read returns -> next post": 27,
            "round trip": 100,
        }
        self.assertEqual(list(got), list(want))
        for name, v in want.items():
            self.assertAlmostEqual(got[name][0], v, msg=name)
            self.assertAlmostEqual(got[name][1], v, msg=name)

    def test_a_file_without_its_rate_or_marks_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(SystemExit):
                timeline_merge.load(end_file(d, "x", {"post_called": [1]}))

    def test_an_empty_segment_has_no_figure(self):
        e = {"post_called": [], "post_returned": [], "data_seen": [], "read_returned": []}
        self.assertTrue(all(v is None for _, v in timeline_merge.segments(e, e, 1.0)))


if __name__ == "__main__":
    unittest.main()
