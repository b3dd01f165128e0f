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

    def test_the_slow_round_trips_are_placed_by_segment(self):
        # 200 round trips of 100 µs; in two of them (the slowest 1%) the server's post call
        # takes 60 µs more, which delays everything after it: the client sees the answer, reads
        # and posts 60 µs later. The tail names the server's post call (and the wire after it,
        # which contains it), nothing before it.
        us = 1000
        n = 200
        late = {50: 60, 120: 60}
        start, t = [], 0
        for i in range(n + 1):
            start.append(t)
            t += 100 + late.get(i, 0)
        c = {
            "post_called": [start[i] * us for i in range(n + 1)],
            "post_returned": [(start[i] + 20) * us for i in range(n + 1)],
            "data_seen": [(start[i] + 70 + late.get(i, 0)) * us for i in range(n)],
            "read_returned": [(start[i] + 73 + late.get(i, 0)) * us for i in range(n)],
        }
        s = {
            "post_called": [(start[i] + 35) * us for i in range(n)],
            "post_returned": [(start[i] + 50 + late.get(i, 0)) * us for i in range(n)],
            "data_seen": [(start[i] + 30) * us for i in range(n)],
            "read_returned": [(start[i] + 32) * us for i in range(n)],
        }
        rows, slow, cut = timeline_merge.tail(c, s, us)
        self.assertEqual((slow, cut), (2, 160))
        excess = {name: round(d - m, 6) for name, m, d in rows}
        self.assertEqual(excess["post call (server)"], 60)
        self.assertEqual(excess["wire: server post -> client sees it"], 60)
        self.assertEqual(excess["round trip"], 60)
        for name in ("post call (client)", "wire: client post -> server sees it",
                     "server: seen -> read returns", "server: read returns -> its post",
                     "client: seen -> read returns", "client: read returns -> next post"):
            self.assertEqual(excess[name], 0, msg=name)

    def test_ends_that_began_stamping_at_different_messages_are_paired_by_time(self):
        # The regular ping-pong, but the server's answers went on the ring one message after
        # its reads did (its direction switched later): the server stamps no post for round
        # trip 0 and the client no DATA seen or read for it. Paired by their places in the
        # files, every cross-end segment would be one round trip off; by time, round trip 0
        # is left out and the others are whole.
        us = 1000
        rounds = range(6)
        c = {
            "post_called": [(100 * i) * us for i in rounds],
            "post_returned": [(100 * i + 20) * us for i in rounds],
            "data_seen": [(100 * i + 70) * us for i in rounds if i > 0],
            "read_returned": [(100 * i + 73) * us for i in rounds if i > 0],
        }
        s = {
            "post_called": [(100 * i + 35) * us for i in rounds if i > 0],
            "post_returned": [(100 * i + 50) * us for i in rounds if i > 0],
            "data_seen": [(100 * i + 30) * us for i in rounds],
            "read_returned": [(100 * i + 32) * us for i in rounds],
        }
        cols, left_out = timeline_merge.per_round(c, s, us)
        self.assertEqual(left_out, 1)
        self.assertEqual(len(cols[0]), 4)
        want = [20, 30, 2, 3, 15, 35, 3, 27, 100]
        for name, col, v in zip(timeline_merge.ROWS, cols, want):
            self.assertEqual(col, [v] * 4, msg=name)

    def test_too_few_round_trips_have_no_tail(self):
        us = 1000
        c = {"post_called": [0, 100 * us], "post_returned": [20 * us],
             "data_seen": [70 * us], "read_returned": [73 * us]}
        s = {"post_called": [35 * us], "post_returned": [50 * us],
             "data_seen": [30 * us], "read_returned": [32 * us]}
        self.assertIsNone(timeline_merge.tail(c, s, us))

    def test_a_file_without_its_rate_or_marks_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(SystemExit):
                timeline_merge.load(end_file(d, "x", {"post_called": [1]}))

    def test_an_empty_segment_has_no_figure(self):
        e = {"post_called": [], "post_returned": [], "data_seen": [], "read_returned": []}
        self.assertTrue(all(v is None for _, v in timeline_merge.segments(e, e, 1.0)))


if __name__ == "__main__":
    unittest.main()
