#!/usr/bin/env python3
"""The plot of scripts/bench-scale: memory and upgrade time against the number of connections.

  scale_plot.py RESULTS.json OUT.svg

RESULTS.json: bench-scale's (its "rows": one per burst of N connections). Two panels side by
side, N on a log axis: what a connection pins (VmPin over the upgraded connections, client and
server) and what it holds more than kernel TCP's in resident memory (VmRSS, the shim's
process less TCP's for the same burst, over the upgraded connections); and how long after the
burst's end its upgrades were all decided, with the burst's own time beside it (the shim's and
kernel TCP's). A figure a run did not give is left out of its line. Standard library only.
"""
import html
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import step_125  # noqa: E402

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#d62728"]


def nice_ticks(lo, hi, log):
    """Axis ticks covering [lo, hi]: powers of ten (log), or 1-2-5 steps from 0."""
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        b = max(b, a + 1)
        return [10.0 ** e for e in range(a, b + 1)]
    top = hi * 1.1 if hi > 0 else 1.0
    step = step_125(top)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def fmt(v):
    if v >= 1000 and v == int(v):
        return f"{int(v):,}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def panel(x0, y0, w, h, title, ylabel, series, ylog, notes=None):
    """One chart at (x0, y0), w by h: series [(label, [(n, value)])] against n on a log axis;
    `notes` {n: text} are written under the axis at their n."""
    pts = [p for _, s in series for p in s]
    o = [f'<text x="{x0 + w / 2}" y="{y0 - 28}" text-anchor="middle" font-size="14" '
         f'font-weight="bold">{html.escape(title)}</text>']
    if not pts:
        o.append(f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" text-anchor="middle">no figures</text>')
        return o
    ns = [n for n, _ in pts]
    xt = nice_ticks(min(ns), max(ns), True)
    vals = [v for _, v in pts]
    if ylog:
        yt = nice_ticks(max(min(vals), 1e-3), max(vals), True)
    else:
        yt = nice_ticks(0, max(vals), False)

    def x(n):
        lo, hi = math.log10(xt[0]), math.log10(xt[-1])
        return x0 + w * (math.log10(n) - lo) / (hi - lo)

    def y(v):
        if ylog:
            lo, hi = math.log10(yt[0]), math.log10(yt[-1])
            return y0 + h - h * (math.log10(max(v, yt[0])) - lo) / (hi - lo)
        return y0 + h - h * v / yt[-1]

    for t in yt:
        o.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{x0 - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for t in xt:
        o.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0}" y2="{y0 + h}" stroke="#eee"/>')
        o.append(f'<text x="{x(t):.1f}" y="{y0 + h + 16}" text-anchor="middle">{fmt(t)}</text>')
    for n, text in sorted((notes or {}).items()):
        o.append(f'<text x="{x(n):.1f}" y="{y0 + h + 28}" text-anchor="middle" font-size="10" '
                 f'fill="#444">{html.escape(text)}</text>')
    o.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 44}" text-anchor="middle">connections (log scale)</text>')
    o.append(f'<text transform="translate({x0 - 52},{y0 + h / 2}) rotate(-90)" text-anchor="middle">'
             f'{html.escape(ylabel)}{" (log scale)" if ylog else ""}</text>')
    o.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y0 + h}" y2="{y0 + h}" stroke="black"/>')
    o.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y0 + h}" stroke="black"/>')
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        s = sorted(s)
        if len(s) > 1:
            path = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v in s)
            o.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        for n, v in s:
            o.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="4" fill="{c}">'
                     f'<title>{html.escape(label)}: {fmt(v)} at {n:,}</title></circle>')
            # (labels above the point for every other line, below for the rest: client and
            # server often coincide)
            dy = -6 if i % 2 == 0 else 14
            o.append(f'<text x="{x(n) + 6:.1f}" y="{y(v) + dy:.1f}" font-size="10" fill="{c}">{fmt(v)}</text>')
        # (the legend under the axis' label, a line each)
        lx, ly = x0, y0 + h + 62 + 15 * i
        o.append(f'<rect x="{lx:.1f}" y="{ly - 9}" width="10" height="10" fill="{c}"/>')
        o.append(f'<text x="{lx + 14:.1f}" y="{ly}" font-size="11">{html.escape(label)}</text>')
    return o


def series(rows):
    """The two panels' lines from bench-scale's rows."""
    def per(row, key, up):
        v, u = row.get(key), row.get(up)
        return v / u if v is not None and u else None

    def more_rss(row, side):
        # (the shim's process's resident memory over kernel TCP's for the same burst)
        r = (row.get("rss_kib") or {}).get(side) or {}
        up = row.get(f"{side}_upgraded")
        if r.get("shim") is None or r.get("tcp") is None or not up:
            return None
        return (r["shim"] - r["tcp"]) / up

    def pts(f):
        return [(r["n"], v) for r in rows for v in [f(r)] if v is not None and v > 0]

    memory = [
        ("pinned, client", pts(lambda r: per(r, "client_pinned_kib", "client_upgraded"))),
        ("pinned, server", pts(lambda r: per(r, "server_pinned_kib", "server_upgraded"))),
        ("resident more than TCP's, client", pts(lambda r: more_rss(r, "client"))),
        ("resident more than TCP's, server", pts(lambda r: more_rss(r, "server"))),
    ]
    time = [
        ("all decided after the burst (shim)", pts(lambda r: r.get("decided_after_s"))),
        ("the burst itself, shim", pts(lambda r: (r.get("burst_ms") or {}).get("shim") and r["burst_ms"]["shim"] / 1000)),
        ("the burst itself, kernel TCP", pts(lambda r: (r.get("burst_ms") or {}).get("tcp") and r["burst_ms"]["tcp"] / 1000)),
    ]
    return memory, time


def upgraded_notes(rows):
    """{n: "upgraded P%"} for each burst (the client's share; the server's when it differs)."""
    out = {}
    for r in rows:
        c, s, n = r.get("client_upgraded"), r.get("server_upgraded"), r["n"]
        if c is None:
            continue
        text = f"{c / n:.1%}".replace(".0%", "%")
        if s is not None and s != c:
            text += f" / {s / n:.1%}".replace(".0%", "%")
        out[n] = "upgraded " + text
    return out


def svg(results):
    rows = results.get("rows", [])
    memory, time = series(rows)
    W, H = 1000, 530
    kind = ("shared-memory rings, this host (real figures)" if results.get("local")
            else "RDMA rings, soft-RoCE VM (emulated: compare as ratios)")
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
         f'Many connections between two processes: memory and upgrade time against N</text>',
         f'<text x="{W / 2}" y="40" text-anchor="middle" font-size="11" fill="#444">'
         f'{html.escape(kind)}; ring up to {results.get("ring_kib", "?")} KiB, idle connections</text>']
    o += panel(90, 110, 360, 280, "Memory per upgraded connection", "KiB", memory, True)
    o += panel(590, 110, 360, 280, "Time", "seconds", time, True, upgraded_notes(rows))
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        results = json.load(f)
    with open(argv[2], "w") as f:
        f.write(svg(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
