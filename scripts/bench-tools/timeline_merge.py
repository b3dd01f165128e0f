#!/usr/bin/env python3
"""Where a shimmed ping-pong's round trips go: the two ends' timelines put together.

    timeline_merge.py CLIENT_FILE SERVER_FILE

Each file is one end's stamps, written at exit by a shim built with `--features timeline`
and run with RDMASHIM_TIMELINE=client:FILE or server:FILE (shim/src/timeline.rs): a `rate NS
TICKS` line (the time-stamp counter's ticks over that many monotonic nanoseconds), then one
line per mark — post_called, post_returned, data_seen, read_returned — with its counter
readings in order. Both processes run on one host, whose CPUs read one counter, so the wire
segments (a post on one end to the other end seeing its completion) are differences of the
two files' stamps; the per-end segments are each file's own. Prints each segment's median and
mean in microseconds, as rdma-core's timeline report does for ring_bench's two threads.
"""

import statistics
import sys


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
    if rate is None or len(marks) != 4:
        raise SystemExit(f"{path}: not a timeline file")
    return marks, rate


def segment(a, b, shift, per_us):
    n = min(len(a), len(b) - shift)
    return sorted((b[i + shift] - a[i]) / per_us for i in range(n))


ROWS = [
    # (name, from end, from mark, to end, to mark, whether "to" is the next round trip's)
    ("post call (client)", "c", "post_called", "c", "post_returned", 0),
    ("wire: client post -> server sees it", "c", "post_called", "s", "data_seen", 0),
    ("server: seen -> read returns", "s", "data_seen", "s", "read_returned", 0),
    ("server: read returns -> its post", "s", "read_returned", "s", "post_called", 0),
    ("post call (server)", "s", "post_called", "s", "post_returned", 0),
    ("wire: server post -> client sees it", "s", "post_called", "c", "data_seen", 0),
    ("client: seen -> read returns", "c", "data_seen", "c", "read_returned", 0),
    ("client: read returns -> next post", "c", "read_returned", "c", "post_called", 1),
    ("round trip", "c", "post_called", "c", "post_called", 1),
]


def segments(c, s, per_us):
    """Each row's (name, median, mean) in µs, or None for one with no pair of stamps."""
    ends = {"c": c, "s": s}
    out = []
    for name, ea, ma, eb, mb, shift in ROWS:
        v = segment(ends[ea][ma], ends[eb][mb], shift, per_us)
        out.append((name, (statistics.median(v), statistics.fmean(v)) if v else None))
    return out


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    c, rate_c = load(argv[1])
    s, rate_s = load(argv[2])
    per_us = (rate_c + rate_s) / 2
    counts = {k: (len(c[k]), len(s[k])) for k in c}
    print(f"timeline: counts (client, server) {counts}; {per_us:.1f} ticks/us")
    if len({n for pair in counts.values() for n in pair}) != 1:
        print("timeline: the ends' counts differ (a DATA seen by another thread, or the "
              "first ones before the stamps began): segments across the ends are not paired")
    for name, v in segments(c, s, per_us):
        if v is None:
            print(f"  {name:<40} {'-':>8} {'-':>8}")
        else:
            print(f"  {name:<40} {v[0]:>8.1f} {v[1]:>8.1f}")


if __name__ == "__main__":
    main(sys.argv)
