"""scripts/bench-kinds' table: raw.tsv (round, size, pattern, one_way_us, p99_us) to results.md.

    kinds_table.py RAW OUT KERNEL DEVICE ROUNDS ITERS

Per size and pattern: the median over the rounds of the one-way latency and of its 99th
percentile; the median of the per-round ratios to ib_write_lat's figure of the same round and
size, with the distribution-free 95% interval of that median (report.py's, as the latency
rounds of scripts/bench judge theirs; none below six rounds) and the ratios' range."""
import csv
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
}


def figures(rows):
    """{(size, pattern, round): (one_way, p99 or None)} of raw.tsv's rows."""
    return {(int(r["size"]), r["pattern"], int(r["round"])):
            (float(r["one_way_us"]), float(r["p99_us"]) if r["p99_us"] else None) for r in rows}


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
            ratios = [v[0] / fig[(s, "dev_write", r)][0] for r, v in runs.items() if (s, "dev_write", r) in fig]
            rat = rng = ci = "–"
            if ratios:
                rat, rng = f"{statistics.median(ratios):.3f}", f"{min(ratios):.2f}–{max(ratios):.2f}"
                iv = median_interval(ratios)
                if iv:
                    ci = f"{iv[0]:.2f}–{iv[1]:.2f}"
            lines.append(f"| {name} | {one:.2f} | {p99} | {rat} | {ci} | {rng} | {len(runs)} |")
        lines.append("")
    return lines


def main(raw, out, kernel, device, rounds, iters):
    with open(raw) as f:
        fig = figures(csv.DictReader(f, delimiter="\t"))
    with open(out, "w") as f:
        f.write("\n".join(table(fig, kernel, device, rounds, iters)))


if __name__ == "__main__":
    main(*sys.argv[1:7])
