"""scripts/bench-kinds' table: raw.tsv (round, size, pattern, one_way_us, p99_us) to results.md.

    kinds_table.py RAW OUT KERNEL DEVICE ROUNDS ITERS [PLOT.svg]

Per size and pattern: the median over the rounds of the one-way latency and of its 99th
percentile; the median of the per-round ratios to ib_write_lat's figure of the same round and
size, with the distribution-free 95% interval of that median (report.py's, as the latency
rounds of scripts/bench judge theirs; none below six rounds) and the ratios' range. PLOT.svg,
if given: those ratios drawn, a panel per size (`svg`)."""
import csv
import html
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import median_interval  # noqa: E402

NAMES = {
    "dev_write": "device: ib_write_lat",
    "dev_send": "device: ib_send_lat",
    "dev_read": "device: ib_read_lat",
    "write": "WRITE, trailer polled in memory",
    "imm": "WRITE WITH IMM, CQ + re-post (today's)",
    "send": "SEND into posted buffers + copy",
    "srq": "SEND into a shared receive queue + copy",
    "read": "told, then RDMA READ pull",
    "mailbox": "WRITE + cursor WRITE, cursor polled",
    "atomic": "WRITE + cursor FETCH AND ADD, cursor polled",
    "ring_imm": "ring stream, WRITE WITH IMM (native API)",
    "ring_records": "ring stream, records (native API)",
    "ring_sends": "ring stream, sends (native API)",
    "ring_srq": "ring stream, sends into an SRQ (native API)",
    "ring_read": "ring stream, READ pull (native API)",
    "ring_duplex": "ring stream, duplex (native API)",
    "shim_imm": "shim, WRITE WITH IMM (sockbench ping-pong)",
    "shim_sends": "shim, sends (sockbench ping-pong)",
    "shim_srq": "shim, sends into an SRQ (sockbench ping-pong)",
    "shim_read": "shim, READ pull (sockbench ping-pong)",
    "shim_duplex": "shim, duplex (sockbench ping-pong)",
}


def figures(rows):
    """{(size, pattern, round): (one_way, p99 or None)} of raw.tsv's rows."""
    return {(int(r["size"]), r["pattern"], int(r["round"])):
            (float(r["one_way_us"]), float(r["p99_us"]) if r["p99_us"] else None) for r in rows}


def round_ratios(fig, size, pattern):
    """The pattern's one-way figure over ib_write_lat's, for each round of `size` that has both."""
    return [v[0] / fig[(size, "dev_write", r)][0] for (s, p, r), v in fig.items()
            if s == size and p == pattern and (size, "dev_write", r) in fig]


def table(fig, kernel, device, rounds, iters):
    """results.md's lines."""
    lines = [f"# The connection kinds' wire patterns, side by side ({kernel}, device {device})", "",
             f"{rounds} rotated rounds, {iters} round trips a measurement; one-way = round trip / 2. "
             "Medians over the rounds; the ratio is the median of each round's figure over "
             "ib_write_lat's of the same round and size, with its distribution-free 95% interval "
             "(six rounds or more) and the ratios' range. Under emulation: compare ratios only.", ""]
    for s in sorted({k[0] for k in fig}):
        lines += [f"## {s} B", "",
                  "| pattern | one-way µs (median) | p99 µs (median) | vs ib_write_lat | 95% interval | range | rounds |",
                  "|---|---:|---:|---:|---|---|---:|"]
        for p, name in NAMES.items():
            runs = {k[2]: v for k, v in fig.items() if k[0] == s and k[1] == p}
            if not runs:
                lines.append(f"| {name} | – | – | – | – | – | 0 |")
                continue
            one = statistics.median(v[0] for v in runs.values())
            p99s = [v[1] for v in runs.values() if v[1] is not None]
            p99 = f"{statistics.median(p99s):.2f}" if p99s else "–"
            rs = round_ratios(fig, s, p)
            rat = rng = ci = "–"
            if rs:
                rat, rng = f"{statistics.median(rs):.3f}", f"{min(rs):.2f}–{max(rs):.2f}"
                iv = median_interval(rs)
                if iv:
                    ci = f"{iv[0]:.2f}–{iv[1]:.2f}"
            lines.append(f"| {name} | {one:.2f} | {p99} | {rat} | {ci} | {rng} | {len(runs)} |")
        lines.append("")
    return lines


def ratios(fig):
    """{(size, pattern): (median, low, high, rounds)} of the per-round ratios to ib_write_lat:
    low-high the distribution-free 95% interval, or the range where the rounds are too few."""
    out = {}
    for s in sorted({k[0] for k in fig}):
        for p in NAMES:
            rs = round_ratios(fig, s, p)
            if rs:
                iv = median_interval(rs) or (min(rs), max(rs))
                out[(s, p)] = (statistics.median(rs), iv[0], iv[1], len(rs))
    return out


TARGET = 1.15  # issue 29's 64 B target for the default kind, against ib_write_lat


def svg(fig, title):
    """The kinds' ratios to ib_write_lat as a plot: a panel per size, a row per pattern, the
    median a dot and its 95% interval (the range, under six rounds) a bar, on a log axis with
    the device (1.0) and the 64 B target (1.15) marked."""
    rat = ratios(fig)
    sizes = sorted({s for s, _ in rat})
    pats = [p for p in NAMES if p != "dev_write" and any((s, p) in rat for s in sizes)]
    if not sizes or not pats:
        return None
    lo = min(0.5, min(v[1] for v in rat.values()) * 0.9)
    hi = max(2.0, max(v[2] for v in rat.values()) * 1.1)
    label_w, panel_w, row_h, top = 300, 300, 24, 70
    W, H = label_w + panel_w * len(sizes) + 20, top + row_h * len(pats) + 50

    def x(panel, v):
        f = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        return label_w + panel * panel_w + 10 + f * (panel_w - 30)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{html.escape(title)}</text>',
         f'<text x="{W / 2}" y="38" text-anchor="middle" font-size="11" fill="#444">one-way latency over '
         'ib_write_lat\'s of the same round: median (dot), 95% interval or range (bar); log scale</text>']
    ticks = [t for t in (0.5, 0.75, 1, 1.15, 1.5, 2, 3, 5, 8, 13, 20) if lo <= t <= hi]
    for pi, s in enumerate(sizes):
        o.append(f'<text x="{x(pi, math.sqrt(lo * hi)):.1f}" y="{top - 12}" text-anchor="middle" '
                 f'font-weight="bold">{s} B</text>')
        for t in ticks:
            xx = x(pi, t)
            style = {1: 'stroke="black"', TARGET: 'stroke="#d62728" stroke-dasharray="4,3"'}.get(t, 'stroke="#ddd"')
            o.append(f'<line class="tick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{top - 4}" y2="{top + row_h * len(pats)}" {style}/>')
            if t != TARGET:  # (its label would sit on 1's: the note below names it)
                o.append(f'<text x="{xx:.1f}" y="{top + row_h * len(pats) + 16}" text-anchor="middle" '
                         f'font-size="10">{t:g}</text>')
        for ri, p in enumerate(pats):
            yy = top + row_h * ri + row_h / 2
            v = rat.get((s, p))
            if v is None:
                o.append(f'<text x="{x(pi, 1):.1f}" y="{yy + 4:.1f}" font-size="10" fill="#b00">no figure</text>')
                continue
            med, a, b, n = v
            tip = f"{NAMES[p]}, {s} B: {med:.3f}x ({a:.2f}-{b:.2f}, {n} rounds)"
            o.append(f'<line x1="{x(pi, a):.1f}" x2="{x(pi, b):.1f}" y1="{yy:.1f}" y2="{yy:.1f}" '
                     f'stroke="#1f77b4" stroke-width="3"/>')
            o.append(f'<circle class="median" data-size="{s}" data-pattern="{p}" data-ratio="{med:.4f}" '
                     f'cx="{x(pi, med):.1f}" cy="{yy:.1f}" r="4.5" fill="#ff7f0e" stroke="black">'
                     f'<title>{html.escape(tip)}</title></circle>')
    for ri, p in enumerate(pats):
        yy = top + row_h * ri + row_h / 2
        o.append(f'<text x="{label_w - 8}" y="{yy + 4:.1f}" text-anchor="end">{html.escape(NAMES[p])}</text>')
    o.append(f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="11" fill="#444">black: the device '
             f'(1.0); red dashed: the default\'s 64 B target ({TARGET})</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main(raw, out, kernel, device, rounds, iters, plot=None):
    with open(raw) as f:
        fig = figures(csv.DictReader(f, delimiter="\t"))
    with open(out, "w") as f:
        f.write("\n".join(table(fig, kernel, device, rounds, iters)))
    if plot:
        text = svg(fig, f"The connection kinds' wire patterns ({device}, {rounds} rounds)")
        if text:
            with open(plot, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main(*sys.argv[1:8])
