#!/usr/bin/env python3
"""Where a shimmed ping-pong's round trips go: the two ends' timelines put together.

    timeline_merge.py CLIENT_FILE SERVER_FILE

Each file is one end's stamps, written at exit by a shim built with `--features timeline`
and run with RDMASHIM_TIMELINE=client:FILE or server:FILE (shim/src/timeline.rs): a `rate NS
TICKS` line (the time-stamp counter's ticks over that many monotonic nanoseconds), then one
line per mark — post_called, post_returned, data_seen, read_returned — with its counter
readings in order. Both processes run on one host, whose CPUs read one counter, so the wire
segments (a post on one end to the other end seeing its completion) are differences of the
two files' stamps.

The stamps are paired by time, round trip by round trip, not by their place in the files:
the ends' first stamps need not belong to the same message (each end stamps from its own
switch to the ring, and a direction may switch a few messages after the other; each keeps
only its first 65,536 of a kind). Round trip i runs from the client's i-th post call to its
next; in it, the server sees the first DATA after that post, reads, posts its answer, and the
client sees the first DATA after the server's post and reads it. A round trip whose stamps are
not all there, in that order, before the client's next post, is left out (and counted).

Prints each segment's median and mean in microseconds, as rdma-core's timeline report does for
ring_bench's two threads, then where the slowest round trips went: each segment's median over
the round trips at or above the round trip's 99th percentile, against its median over all of
them (the p99's excess, by segment: which part of the slow round trips is slow).
"""

import bisect
import statistics
import sys

MARKS = ("post_called", "post_returned", "data_seen", "read_returned")


def load(path):
    marks, rate = {}, None
    with open(path) as f:
        for line in f:
            name, *vals = line.split()
            if name == "rate":
                ns, ticks = map(int, vals)
                rate = ticks / (ns / 1000.0)
            else:
                marks[name] = [int(v) for v in vals]
    if rate is None or sorted(marks) != sorted(MARKS):
        raise SystemExit(f"{path}: not a timeline file")
    return marks, rate


ROWS = [
    "post call (client)",
    "wire: client post -> server sees it",
    "server: seen -> read returns",
    "server: read returns -> its post",
    "post call (server)",
    "wire: server post -> client sees it",
    "client: seen -> read returns",
    "client: read returns -> next post",
    "round trip",
]


def _first(seq, t):
    """The first stamp of `seq` (sorted) at or after `t`, or None."""
    if t is None:
        return None
    j = bisect.bisect_left(seq, t)
    return seq[j] if j < len(seq) else None


def per_round(c, s, per_us):
    """Each row's values, round trip by round trip (one list per row, in ROWS' order, all of
    one length), and how many of the client's round trips could not be paired."""
    cols = [[] for _ in ROWS]
    cp = c["post_called"]
    left_out = 0
    for i in range(len(cp) - 1):
        t0, t1 = cp[i], cp[i + 1]
        c_ret = _first(c["post_returned"], t0)
        s_seen = _first(s["data_seen"], t0)
        s_read = _first(s["read_returned"], s_seen)
        s_post = _first(s["post_called"], s_read)
        s_ret = _first(s["post_returned"], s_post)
        c_seen = _first(c["data_seen"], s_post)
        c_read = _first(c["read_returned"], c_seen)
        got = (c_ret, s_seen, s_read, s_post, s_ret, c_seen, c_read)
        if any(v is None for v in got) or c_ret > t1 or c_read > t1:
            left_out += 1
            continue
        vals = (
            c_ret - t0,
            s_seen - t0,
            s_read - s_seen,
            s_post - s_read,
            s_ret - s_post,
            c_seen - s_post,
            c_read - c_seen,
            t1 - c_read,
            t1 - t0,
        )
        for col, v in zip(cols, vals):
            col.append(v / per_us)
    return cols, left_out


def segments(c, s, per_us):
    """Each row's (name, (median, mean)) in µs, or (name, None) when no round trip paired."""
    cols, _ = per_round(c, s, per_us)
    return [
        (name, (statistics.median(col), statistics.fmean(col)) if col else None)
        for name, col in zip(ROWS, cols)
    ]


def tail(c, s, per_us, q=0.99):
    """(rows, how many slow round trips, the cut in µs): each row's (name, median over every
    round trip, median over the slowest ones) — the round trips whose round trip is at or
    above its q-quantile. None with fewer than 1/(1-q) round trips paired: no tail to speak
    of."""
    cols, _ = per_round(c, s, per_us)
    rt = cols[-1]
    n = len(rt)
    if n < round(1 / (1 - q)):
        return None
    cut = sorted(rt)[min(n - 1, int(q * n))]
    slow = [i for i in range(n) if rt[i] >= cut]
    rows = [
        (name, statistics.median(col), statistics.median(col[i] for i in slow))
        for name, col in zip(ROWS, cols)
    ]
    return rows, len(slow), cut


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    c, rate_c = load(argv[1])
    s, rate_s = load(argv[2])
    per_us = (rate_c + rate_s) / 2
    counts = {k: (len(c[k]), len(s[k])) for k in MARKS}
    cols, left_out = per_round(c, s, per_us)
    print(f"timeline: counts (client, server) {counts}; {per_us:.1f} ticks/us; "
          f"{len(cols[0])} round trips paired, {left_out} left out")
    segs = segments(c, s, per_us)
    # (a tenth of a µs under emulation; thousandths where a round trip takes a microsecond or
    # two — shared-memory rings on a real CPU)
    fine = any(v is not None and v[0] < 10 for name, v in segs if name == "round trip")
    d = 3 if fine else 1
    for name, v in segs:
        if v is None:
            print(f"  {name:<40} {'-':>8} {'-':>8}")
        else:
            print(f"  {name:<40} {v[0]:>8.{d}f} {v[1]:>8.{d}f}")
    t = tail(c, s, per_us)
    if t is None:
        return
    rows, slow, cut = t
    print(f"timeline: the {slow} round trips of {cut:.1f} us or more (the p99 and above), "
          "segment medians: all round trips, the slow ones, the difference")
    for name, med, med_slow in rows:
        print(f"  {name:<40} {med:>8.{d}f} {med_slow:>8.{d}f} {med_slow - med:>+8.{d}f}")


if __name__ == "__main__":
    main(sys.argv)
