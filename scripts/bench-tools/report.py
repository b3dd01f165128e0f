#!/usr/bin/env python3
"""The report of scripts/bench: medians, pair-by-pair ratios, the rdmashim column's label
from the shim's own stats files, and the outputs. A run of `scripts/bench --local` (META's
local=1: kernel TCP and rdmashim's shared-memory rings on one host) has figures of its own
(LOCAL_ROWS), each ratio judged against its target.

  report.py RAW.tsv STATS_DIR META.txt OUT_DIR

RAW.tsv: one line per figure and run, `round system test metric value` (tab-separated);
metric `failed` carries the error, `skipped` marks a run not made after an earlier failure.
STATS_DIR/<test>/<pid>.json: rdmashim's stats records (docs/shim.md). META.txt: key=value.
Writes OUT_DIR/{results.json,results.md,latency.svg,throughput.svg,app.svg} and prints the
plain-text table on stdout. Standard library only; the SVGs are written by hand.
"""
import glob
import html
import json
import math
import os
import re
import statistics
import sys

SYSTEMS = ["tcp", "shim", "rsocket", "device"]
NAMES = {"tcp": "kernel TCP", "shim": "rdmashim", "rsocket": "rsocket", "device": "device"}
COLORS = {"tcp": "#7f7f7f", "shim": "#1f77b4", "rsocket": "#ff7f0e", "device": "#2ca02c"}

# (id, label, unit, better, {system: (test, metric)})
ROWS = []


def row(rid, label, unit, better, tests, device=None, into=None, target=None):
    src = {s: (t, m) for s, (t, m) in tests.items()}
    if device:
        src["device"] = device
    (ROWS if into is None else into).append({"id": rid, "label": label, "unit": unit, "better": better,
                                             "src": src, "target": target})


def three(test, metric):
    return {s: (test, metric) for s in ("tcp", "shim", "rsocket")}


for size, dev in (("64", "64 B"), ("4096", "4 KiB")):
    for q, qn in (("p50_us", "median"), ("p99_us", "p99")):
        row(f"sockperf_{size}_{q[:3]}", f"latency {dev} sockperf, {qn}", "us", "lower",
            three(f"sockperf_{size}", q), (f"devlat_{size}", q))
for size, dev in (("64", "64 B"), ("4096", "4 KiB")):
    for q, qn in (("p50_us", "median"), ("p99_us", "p99")):
        row(f"pingpong_{size}_{q[:3]}", f"latency {dev} send/recv, {qn}", "us", "lower",
            three(f"pingpong_{size}", q), (f"devlat_{size}", q))
for q, qn in (("p50_us", "median"), ("p99_us", "p99")):
    row(f"pingpong_64_shared_{q[:3]}", f"latency 64 B send/recv, both ends on one CPU, {qn}", "us", "lower",
        three("pingpong_64_shared", q))
row("iperf3_P1", "iperf3, 1 stream", "Gbit/s", "higher", three("iperf3_P1", "gbit_s"), ("devbw", "gbit_s"))
row("iperf3_P4", "iperf3, 4 streams", "Gbit/s", "higher", three("iperf3_P4", "gbit_s"), ("devbw", "gbit_s"))
row("stream", "send/recv stream, 64 KiB writes", "Gbit/s", "higher", three("stream", "gbit_s"), ("devbw", "gbit_s"))
for mode, what in (("C1", "one client, -P 1"), ("P1", "-P 1"), ("P16", "-P 16")):
    for op in ("SET", "GET"):
        row(f"redis_{op}_{mode}", f"redis-benchmark {op} {what}", "req/s", "higher",
            three(f"redis_{mode}", f"{op.lower()}_rps"))
row("connrate", "short connections (both ends preloaded)", "conn/s", "higher", three("connrate", "conn_s"))
row("connrate_fallback", "fallback: preloaded client -> plain server", "conn/s", "higher",
    {"tcp": ("connrate", "conn_s"), "shim": ("connrate_fallback", "conn_s"),
     "rsocket": ("connrate_fallback", "conn_s")})
row("first", "first connection of a fresh process (both ends preloaded)", "ms", "lower", three("first", "first_ms"))
row("first_cpu", "CPU time of that process (one connection, then 1 s idle)", "ms", "lower", three("first", "cpu_ms"))
row("first_fallback", "fallback: first connection of a fresh process", "ms", "lower",
    {"tcp": ("first", "first_ms"), "shim": ("first_fallback", "first_ms"),
     "rsocket": ("first_fallback", "first_ms")})
row("first_fallback_cpu", "fallback: CPU time of that process", "ms", "lower",
    {"tcp": ("first", "cpu_ms"), "shim": ("first_fallback", "cpu_ms"),
     "rsocket": ("first_fallback", "cpu_ms")})

# ---- same host (scripts/bench --local): kernel TCP on 127.0.0.1 against the shared-memory rings.
# A target is (op, ratio) on rdmashim / TCP: the issue's ("64 B ping-pong <= 1/10 of loopback
# TCP's latency", "a 64 KiB stream >= 3x", "redis-benchmark >= 2x"), and on one shared CPU,
# where spinning cannot help, never worse than TCP.
LOCAL_SYSTEMS = ["tcp", "shim"]
LOCAL_ROWS = []


def two(test, metric):
    return {s: (test, metric) for s in LOCAL_SYSTEMS}


for where, sfx, fast, slow in (("", "", ("<=", 0.1), None), (", both ends on one CPU", "_shared", ("<=", 1.0), None)):
    for tool, tn in (("sockperf", "sockperf"), ("pingpong", "send/recv")):
        for q, qn in (("p50_us", "median"), ("p99_us", "p99")):
            row(f"{tool}_64{sfx}_{q[:3]}", f"latency 64 B {tn}{where}, {qn}", "us", "lower",
                two(f"{tool}_64{sfx}", q), into=LOCAL_ROWS, target=fast if q == "p50_us" else slow)
    row(f"pingpong_64{sfx}_cpu", f"CPU time per 64 B round trip, both ends{where}", "us", "lower",
        two(f"pingpong_64{sfx}", "cpu_us"), into=LOCAL_ROWS)
    if not sfx:
        for tool, tn in (("sockperf", "sockperf"), ("pingpong", "send/recv")):
            for q, qn in (("p50_us", "median"), ("p99_us", "p99")):
                row(f"{tool}_4096_{q[:3]}", f"latency 4 KiB {tn}, {qn}", "us", "lower",
                    two(f"{tool}_4096", q), into=LOCAL_ROWS)
    row(f"stream{sfx}", f"send/recv stream, 64 KiB writes{where}", "Gbit/s", "higher", two(f"stream{sfx}", "gbit_s"),
        into=LOCAL_ROWS, target=(">=", 3.0) if not sfx else (">=", 1.0))
    if not sfx:
        row("iperf3_P1", "iperf3, 1 stream", "Gbit/s", "higher", two("iperf3_P1", "gbit_s"), into=LOCAL_ROWS)
        row("iperf3_P4", "iperf3, 4 streams", "Gbit/s", "higher", two("iperf3_P4", "gbit_s"), into=LOCAL_ROWS)
    for mode, what in (("C1", "one client, -P 1"), ("P1", "50 clients, -P 1"), ("P16", "50 clients, -P 16")):
        for op in ("SET", "GET"):
            row(f"redis{sfx}_{op}_{mode}", f"redis-benchmark {op} {what}{where}", "req/s", "higher",
                two(f"redis{sfx}_{mode}", f"{op.lower()}_rps"), into=LOCAL_ROWS,
                target=(">=", 2.0) if not sfx else (">=", 1.0))
row("connrate", "short connections (connect, 64 B echo, close)", "conn/s", "higher", two("connrate", "conn_s"),
    into=LOCAL_ROWS)
row("first", "first connection of a fresh process", "ms", "lower", two("first", "first_ms"), into=LOCAL_ROWS)
row("first_cpu", "CPU time of that process (one connection, then 1 s idle)", "ms", "lower", two("first", "cpu_ms"),
    into=LOCAL_ROWS)
row("hold", "memory per held connection, both ends (Pss, 100 connections)", "KiB", "lower",
    two("hold", "kib_per_conn"), into=LOCAL_ROWS)


def target_verdict(rw):
    """Whether a row's median ratio (rdmashim / TCP) meets its target: None without a target."""
    t = rw.get("target")
    r = rw["shim_ratio"].get("tcp")
    if not t:
        return None
    if not r or r["median"] is None:
        return "no ratio"
    op, want = t
    ok = r["median"] <= want if op == "<=" else r["median"] >= want
    return "met" if ok else "missed"


def target_text(t):
    if not t:
        return "-"
    op, want = t
    return f"{'≤' if op == '<=' else '≥'} {want:g}x"


DEVICE_TOOL = {"devlat_64": "ib_write_lat -R -s 64 (t_typical / 99%)",
               "devlat_4096": "ib_write_lat -R -s 4096 (t_typical / 99%)",
               "devbw": "ib_write_bw -R -s 65536"}


# The latency rounds (scripts/bench's BENCH_LAT_ROUNDS): rdmashim's 64 B tools against the
# device's ib_write_lat, round by round, and the target they are judged against.
LAT_ROUNDS_DEVICE = ("lr_devlat_64", "p50_us")
LAT_ROUNDS_TOOLS = [("lr_pingpong_64", "send/recv ping-pong"), ("lr_sockperf_64", "sockperf ping-pong")]
LAT_TARGET = 1.15


def median_interval(xs, level=0.95):
    """A distribution-free interval for the median of xs: the order statistics (k, n+1-k) with
    the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) <= k-1), is at least `level`.
    Returns (low, high, coverage), or None when n is too small for that level (n < 6 at 95%)."""
    v = sorted(xs)
    n = len(v)
    best = None
    for k in range(1, n // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        cover = 1 - 2 * tail
        if cover < level:
            break
        best = (v[k - 1], v[n - k], cover)
    return best


def quartiles(xs):
    """(q1, median, q3) of xs ("inclusive" quartiles; a single value is all three)."""
    return tuple(statistics.quantiles(xs, n=4, method="inclusive")) if len(xs) > 1 else (xs[0],) * 3


def latency_rounds(ok, failed):
    """Per shim tool: the per-round ratios against the device and what they say about the
    target. Rounds where either side has no figure are left out (and counted)."""
    dev = ok.get(("device",) + LAT_ROUNDS_DEVICE, {})
    out = []
    for test, name in LAT_ROUNDS_TOOLS:
        shim = ok.get(("shim", test, "p50_us"), {})
        if not shim and not failed.get(("shim", test)):
            continue   # (a run without this tool)
        rounds = sorted(set(dev) | set(shim) | {r for r, _ in failed.get(("shim", test), [])}
                        | {r for r, _ in failed.get(("device", LAT_ROUNDS_DEVICE[0]), [])})
        pairs = [(r, shim[r], dev[r]) for r in rounds if r in shim and r in dev and dev[r] > 0]
        ratios = [a / b for _, a, b in pairs]
        e = {"test": test, "tool": name, "rounds": len(rounds), "pairs": len(pairs),
             "per_round": [{"round": r, "shim_us": a, "device_us": b, "ratio": a / b} for r, a, b in pairs],
             "failed": [{"system": s, "round": r, "error": m}
                        for s, t in (("shim", test), ("device", LAT_ROUNDS_DEVICE[0]))
                        for r, m in failed.get((s, t), [])],
             "target": LAT_TARGET}
        if ratios:
            q = quartiles(ratios)
            ci = median_interval(ratios)
            # each side's lower quartile over the rounds: its fast runs, compared with each other
            lq = [quartiles(xs)[0] for xs in ([a for _, a, _ in pairs], [b for _, _, b in pairs])]
            e.update({"shim_median_us": statistics.median(a for _, a, _ in pairs),
                      "device_median_us": statistics.median(b for _, _, b in pairs),
                      "median": statistics.median(ratios), "q1": q[0], "q3": q[2],
                      "min": min(ratios), "max": max(ratios),
                      "fast_shim_us": lq[0], "fast_device_us": lq[1], "fast_ratio": lq[0] / lq[1],
                      "at_or_below_target": sum(x <= LAT_TARGET for x in ratios),
                      "interval": {"low": ci[0], "high": ci[1], "coverage": ci[2]} if ci else None})
            if ci is None:
                e["verdict"] = f"too few rounds ({len(ratios)}) for a 95% interval: not resolved"
            elif ci[1] <= LAT_TARGET:
                e["verdict"] = f"meets the {LAT_TARGET}x target (the whole interval is at or below it)"
            elif ci[0] > LAT_TARGET:
                e["verdict"] = f"misses the {LAT_TARGET}x target (the whole interval is above it)"
            else:
                e["verdict"] = f"not resolved: the interval spans {LAT_TARGET}x"
        else:
            e["verdict"] = "no round with both figures"
        out.append(e)
    return out


def load_raw(path):
    ok, failed, skipped = {}, {}, set()
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 5:
            continue
        r, s, t, m, v = parts
        r = int(r)
        if m == "failed":
            failed.setdefault((s, t), []).append((r, v))
        elif m == "skipped":
            skipped.add((s, t, r))
        else:
            try:
                ok.setdefault((s, t, m), {})[r] = float(v)
            except ValueError:
                failed.setdefault((s, t), []).append((r, f"unparsable value {v!r}"))
    return ok, failed, skipped


def load_stats(d):
    per_test, tot = {}, {"records": 0, "upgraded": 0, "fallback": 0, "reasons": {}, "rdma": 0, "shm": 0}
    for f in sorted(glob.glob(os.path.join(d, "*", "*.json"))):
        test = os.path.basename(os.path.dirname(f))
        try:
            with open(f) as fh:
                s = json.load(fh)
        except (OSError, ValueError):
            continue
        c = s.get("connections", {})
        b = s.get("bytes", {})
        tot["rdma"] += b.get("ring_tx", 0) + b.get("ring_rx", 0)
        tot["shm"] += b.get("shm_tx", 0) + b.get("shm_rx", 0)
        for agg in (per_test.setdefault(test, {"records": 0, "upgraded": 0, "fallback": 0, "reasons": {}}), tot):
            agg["records"] += 1
            agg["upgraded"] += c.get("upgraded", 0)
            agg["fallback"] += c.get("fallback", 0)
            for k, n in c.get("fallback_reasons", {}).items():
                if n:
                    agg["reasons"][k] = agg["reasons"].get(k, 0) + n
    return per_test, tot


def shim_label(tot):
    n = tot["upgraded"] + tot["fallback"]
    if tot["records"] == 0 or n == 0:
        return "rdmashim (no stats written: shim not loaded?)", "unknown"
    if tot["upgraded"] == 0:
        return f"rdmashim (0 of {n} connections upgraded: pass-through)", "pass-through"
    # (which rings carried the upgraded bytes: a run over RDMA whose ends met over shared
    # memory measured the wrong thing, and says so)
    rdma, shm = tot.get("rdma", 0), tot.get("shm", 0)
    over = {(True, False): ", over RDMA", (False, True): ", over shared memory",
            (True, True): ", over RDMA and shared memory"}.get((rdma > 0, shm > 0), "")
    if tot["fallback"] == 0:
        return f"rdmashim ({n} of {n} connections upgraded{over})", "upgraded"
    return f"rdmashim ({tot['upgraded']} of {n} connections upgraded{over}: mixed)", "mixed"


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def short_error(msg):
    m = msg
    pre = ""
    if m.startswith("server: "):
        pre, m = "server ", m[len("server: "):]
    if m.startswith("P") and re.match(r"P\d+: ", m):
        pre, m = pre + m.split(":")[0] + " ", m.split(": ", 1)[1]
    m = re.sub(r"^exit \d+: ", "", m)
    m = re.sub(r"^(sockperf: )?ERROR: ", "", m)
    e = re.search(r"errno=\d+ ([^)]*)\)", m)
    call = re.match(r"(\w+\(\))", m)
    if e:
        m = (call.group(1) + ": " if call else "") + e.group(1)
    ip = re.search(r"\(iperf3: ([^)]*)\)", m)
    if ip:
        m = m.split(" (iperf3:")[0] + "; " + ip.group(1)
    m = pre + m
    return m if len(m) <= 60 else m[:59] + "…"


def main(raw, stats_dir, meta_path, out):
    meta = {}
    with open(meta_path) as f:
        meta_lines = f.readlines()
    for line in meta_lines:
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            meta[k] = v
    ok, failed, skipped = load_raw(raw)
    per_test, tot = load_stats(stats_dir)
    label, mode = shim_label(tot)
    local = meta.get("local") == "1"
    systems, rows, others = (LOCAL_SYSTEMS, LOCAL_ROWS, ("tcp",)) if local else (SYSTEMS, ROWS, ("tcp", "rsocket", "device"))

    rows_out = []
    for rw in rows:
        cells = {}
        for s in systems:
            if s not in rw["src"]:
                cells[s] = None
                continue
            t, m = rw["src"][s]
            runs = ok.get((s, t, m), {})
            fails = failed.get((s, t), [])
            cell = {"test": t, "metric": m, "runs": {str(k): v for k, v in sorted(runs.items())},
                    "median": statistics.median(runs.values()) if runs else None,
                    "failed": fails[0][1] if fails else None,
                    "failed_runs": [r for r, _ in fails]}
            if s == "device":
                cell["tool"] = DEVICE_TOOL.get(t, t)
            if s == "shim":
                st = per_test.get(t)
                if st:
                    cell["shim_connections"] = st
            cells[s] = cell
        ratios = {}
        for other in others:
            a, b = cells.get("shim"), cells.get(other)
            if not a or not b:
                continue
            rs = [a["runs"][k] / b["runs"][k] for k in a["runs"] if k in b["runs"] and b["runs"][k] > 0]
            ratios[other] = {"median": statistics.median(rs) if rs else None, "pairs": len(rs)}
        rows_out.append({"id": rw["id"], "label": rw["label"], "unit": rw["unit"],
                         "better": rw["better"], "systems": cells, "shim_ratio": ratios,
                         "target": rw["target"]})
        rows_out[-1]["verdict"] = target_verdict(rows_out[-1])

    def cell_text(c, short=True):
        if c is None:
            return "n/a"
        if c["median"] is None:
            err = c["failed"] or "no result"
            return f"failed ({short_error(err) if short else err})"
        t = fmt(c["median"])
        if c["failed"]:
            t += " *"
        return t

    def ratio_text(rw, other):
        r = rw["shim_ratio"].get(other)
        if not r or r["median"] is None:
            return "-"
        return f"{r['median']:.2f}x"

    # ---- plain-text table
    heads = ["figure", "unit"] + [NAMES[s] if s != "shim" else "rdmashim" for s in systems] \
        + [f"shim/{NAMES[o] if o != 'tcp' else 'TCP'}" for o in others]
    if local:
        heads += ["target", "verdict"]
    lines = []
    for rw in rows_out:
        lines.append([rw["label"], rw["unit"]] + [cell_text(rw["systems"][s]) for s in systems]
                     + [ratio_text(rw, o) for o in others]
                     + ([target_text(rw["target"]), rw["verdict"] or "-"] if local else []))
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(heads)]

    def fmt_line(cols):
        return "  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i]) for i, c in enumerate(cols)).rstrip()

    failures = []   # (system, [tests], error, runs): one entry per system and error
    for rw in rows_out:
        for s in systems:
            c = rw["systems"][s]
            if not (c and c["failed"]):
                continue
            same = [f for f in failures if f[0] == s and short_error(f[2]) == short_error(c["failed"])]
            if same:
                if c["test"] not in same[0][1]:
                    same[0][1].append(c["test"])
            else:
                failures.append((s, [c["test"]], c["failed"], c["failed_runs"]))
    fallback_reasons = ", ".join(f"{k} x{n}" for k, n in sorted(tot["reasons"].items())) or "none"
    note = (f"rdmashim column: {label}. Counted from the shim's stats files ({tot['records']} process "
            f"records; each connection is counted once by each end running the shim); reasons it "
            f"stayed on TCP: {fallback_reasons}.")
    if mode == "pass-through":
        note += (" These rdmashim figures are the shim's pass-through (kernel TCP) path, not "
                 + ("shared-memory" if local else "RDMA") + " figures.")
    txt = []
    txt.append(f"rdmashim benchmark, {meta.get('date', '')}: {meta.get('runs')} run(s) per figure "
               f"(median; ratios are medians of per-run pairs)")
    txt.append(f"device {meta.get('device', '')}; {meta.get('nproc')} CPUs ({meta.get('cpu')}); "
               f"kernel {meta.get('kernel')}; rdma-core {meta.get('rdma_core')}")
    txt.append("")
    txt.append(fmt_line(heads))
    txt.append(fmt_line(["-" * w for w in widths]))
    for l in lines:
        txt.append(fmt_line(l))
    txt.append("")
    txt.append(note)
    if not local:
        txt.append("device column: " + "; ".join(f"{k}: {v}" for k, v in DEVICE_TOOL.items()) + ".")
    txt.append("Latencies are one-way (round trip / 2), in microseconds.")
    txt.append("* = some runs failed (median of the others).")
    if failures:
        txt.append("failures (each recorded once, not retried in later runs):")
        for s, t, e, rr in failures:
            txt.append(f"  {NAMES[s]} / {', '.join(t)} (run {','.join(map(str, rr))}): {e}")
    lat_rounds = latency_rounds(ok, failed)
    if lat_rounds:
        txt.append("")
        txt.append(f"64 B latency against the device ({meta.get('lat_rounds', '?')} short rounds, "
                   "order rotated; ratio = rdmashim / ib_write_lat per round):")
        for e in lat_rounds:
            txt.append("  " + lat_rounds_line(e))
    table = "\n".join(txt)
    print(table)

    os.makedirs(out, exist_ok=True)
    result = {"meta": meta, "systems": {s: NAMES[s] for s in systems},
              "shim": {"label": label, "mode": mode, "connections": tot, "per_test": per_test},
              "rows": rows_out, "latency_rounds": lat_rounds, "failures": [{"system": s, "test": t, "error": e, "runs": rr}
                                             for s, t, e, rr in failures]}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    if local:
        charts = write_charts_local(out, rows_out, label)
        write_md_local(out, meta, rows_out, label, mode, note, failures, cell_text, ratio_text, charts)
        return
    charts = write_charts(out, rows_out, label)
    write_md(out, meta, rows_out, label, mode, note, failures, cell_text, ratio_text, charts, tot,
             lat_rounds)


def lat_rounds_line(e):
    if "median" not in e:
        return f"{e['tool']}: {e['verdict']}"
    ci = e["interval"]
    iv = f"95% interval {ci['low']:.2f}-{ci['high']:.2f}x" if ci else "no 95% interval"
    return (f"{e['tool']}: median ratio {e['median']:.2f}x over {e['pairs']} rounds ({iv}; "
            f"quartiles {e['q1']:.2f}-{e['q3']:.2f}x, range {e['min']:.2f}-{e['max']:.2f}x; "
            f"{e['at_or_below_target']} of {e['pairs']} rounds <= {e['target']}x; fast runs "
            f"{e['fast_ratio']:.2f}x): {e['verdict']}")


# ---- SVG --------------------------------------------------------------------------------------

def step_125(top):
    """The step of a linear axis from 0 to `top` > 0: 1, 2 or 5 times a power of ten, the
    smallest that takes at most six steps."""
    step = 10 ** math.floor(math.log10(top / 5))
    for m in (1, 2, 5):
        if top / (step * m) <= 6:
            return step * m
    return step * 10


def svg_bars(title, unit, groups, series, log, note=""):
    """groups: [(label, {system: (median, p99, failed_msg) or None})]; series: [(sys, label)]."""
    W, H, L, R, T, B = 900, 440, 78, 20, 78, 70
    pw, ph = W - L - R, H - T - B
    vals = [v for _, d in groups for x in d.values() if x for v in x[:2] if v]
    if not vals:
        vals = [1.0]
    if log:
        lo = 10 ** math.floor(math.log10(min(vals)))
        hi = 10 ** math.ceil(math.log10(max(vals) * 1.05))
        if hi <= lo:
            hi = lo * 10

        def y(v):
            return T + ph - ph * (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        ticks = [lo * 10 ** i for i in range(int(round(math.log10(hi / lo))) + 1)]
    else:
        top = max(vals) * 1.15
        step = step_125(top)
        hi = math.ceil(top / step) * step

        def y(v):
            return T + ph - ph * v / hi
        ticks = [i * step for i in range(int(round(hi / step)) + 1)]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    if note:
        o.append(f'<text x="{W / 2}" y="37" text-anchor="middle" font-size="11" fill="#444">{html.escape(note)}</text>')
    # legend
    lx = L
    for s, lab in series:
        o.append(f'<rect x="{lx}" y="48" width="12" height="12" fill="{COLORS[s]}"/>')
        o.append(f'<text x="{lx + 16}" y="58">{html.escape(lab)}</text>')
        lx += 24 + 7 * len(lab)
    for t in ticks:
        yy = y(t)
        o.append(f'<line x1="{L}" x2="{W - R}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{yy + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    o.append(f'<text transform="translate(18,{T + ph / 2}) rotate(-90)" text-anchor="middle">'
             f'{html.escape(unit)}{" (log scale)" if log else ""}</text>')
    gw = pw / len(groups)
    bw = min(34, gw * 0.8 / len(series))
    for gi, (glab, d) in enumerate(groups):
        gx = L + gi * gw + (gw - bw * len(series)) / 2
        for si, (s, _) in enumerate(series):
            x = gx + si * bw
            v = d.get(s)
            if v is None:
                continue
            med, p99, err = v
            if med is None:
                tip = f"<title>{html.escape(NAMES[s])}: failed ({html.escape(err or 'no result')})</title>"
                o.append(f'<text transform="translate({x + bw / 2 + 4:.1f},{T + ph - 4}) rotate(-90)" '
                         f'font-size="11" fill="#b00">{tip}failed</text>')
                continue
            yy = y(med)
            o.append(f'<rect x="{x + 1:.1f}" y="{yy:.1f}" width="{bw - 2:.1f}" height="{T + ph - yy:.1f}" '
                     f'fill="{COLORS[s]}"><title>{html.escape(NAMES[s])}: {fmt(med)} {html.escape(unit)}'
                     f'{"" if p99 is None else f", p99 {fmt(p99)}"}</title></rect>')
            if p99 is not None:
                py = y(p99)
                cx = x + bw / 2
                o.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{yy:.1f}" y2="{py:.1f}" stroke="black" stroke-dasharray="2,2"/>')
                o.append(f'<line x1="{cx - bw / 3:.1f}" x2="{cx + bw / 3:.1f}" y1="{py:.1f}" y2="{py:.1f}" stroke="black" stroke-width="2"/>')
            ty = (min(yy, y(p99)) if p99 is not None else yy) - 4
            o.append(f'<text x="{x + bw / 2:.1f}" y="{ty:.1f}" text-anchor="middle" font-size="10">{fmt(med)}</text>')
        o.append(f'<text x="{L + gi * gw + gw / 2:.1f}" y="{T + ph + 18}" text-anchor="middle">{html.escape(glab)}</text>')
    o.append(f'<line x1="{L}" x2="{W - R}" y1="{T + ph}" y2="{T + ph}" stroke="black"/>')
    o.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{T + ph}" stroke="black"/>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def write_charts(out, rows_out, label):
    by = {r["id"]: r for r in rows_out}

    def val(rid, s, p99id=None):
        c = by[rid]["systems"].get(s)
        if c is None:
            return None
        p99 = by[p99id]["systems"][s]["median"] if p99id and by[p99id]["systems"].get(s) else None
        return (c["median"], p99, c["failed"])

    series = [("tcp", "kernel TCP"), ("shim", label), ("rsocket", "rsocket"), ("device", "device (perftest)")]
    lat_groups = []
    for size, sz in (("64", "64 B"), ("4096", "4 KiB")):
        for tool, tn in (("sockperf", "sockperf"), ("pingpong", "send/recv")):
            lat_groups.append((f"{tn} {sz}", {s: val(f"{tool}_{size}_p50", s, f"{tool}_{size}_p99")
                                              for s, _ in series}))
    lat_groups.append(("send/recv 64 B, one CPU", {s: val("pingpong_64_shared_p50", s, "pingpong_64_shared_p99")
                                                   for s, _ in series}))
    charts = {}
    with open(os.path.join(out, "latency.svg"), "w") as f:
        f.write(svg_bars("One-way latency: median (bar) and p99 (marker)", "microseconds", lat_groups, series, True,
                         "ping-pong round trip / 2; device = ib_write_lat -R t_typical / 99%"))
    charts["latency"] = "latency.svg"
    tp_groups = [("iperf3, 1 stream", {s: val("iperf3_P1", s) for s, _ in series}),
                 ("iperf3, 4 streams", {s: val("iperf3_P4", s) for s, _ in series}),
                 ("send/recv stream", {s: val("stream", s) for s, _ in series})]
    with open(os.path.join(out, "throughput.svg"), "w") as f:
        f.write(svg_bars("Throughput", "Gbit/s", tp_groups, series, False,
                         "device = ib_write_bw -R -s 65536"))
    charts["throughput"] = "throughput.svg"
    app_groups = [(f"{op} -P {p}", {s: val(f"redis_{op}_P{p}", s) for s, _ in series[:3]})
                  for p in ("1", "16") for op in ("SET", "GET")]
    with open(os.path.join(out, "app.svg"), "w") as f:
        f.write(svg_bars("redis-benchmark requests per second", "requests/s", app_groups, series[:3], False))
    charts["app"] = "app.svg"
    return charts


# ---- markdown ---------------------------------------------------------------------------------

def write_md(out, meta, rows_out, label, mode, note, failures, cell_text, ratio_text, charts, tot,
             lat_rounds):
    md = []
    md.append("# rdmashim benchmark results")
    md.append("")
    md.append("Generated by `scripts/bench --publish` (the measurements run inside the soft-RoCE VM "
              "when the host has no RDMA device). Do not edit by hand.")
    md.append("")
    md.append(f"- **Date:** {meta.get('date')}")
    where = "inside the soft-RoCE VM (`scripts/rdma-vm`, qemu " + meta.get("accel", "tcg").upper() + ")" \
        if meta.get("in_vm") == "1" else "on the host"
    md.append(f"- **Machine:** {meta.get('nproc')} CPUs, {meta.get('cpu')}, {where}"
              + (f"; host: {meta['host']}" if meta.get("host") else ""))
    md.append(f"- **Kernel:** {meta.get('kernel')}")
    md.append(f"- **Device:** {meta.get('device')}")
    md.append(f"- **rdma-core:** {meta.get('rdma_core')} (rsocket: `{meta.get('rsocket_lib')}`)")
    md.append(f"- **Tools:** {meta.get('tools')}")
    md.append(f"- **Runs:** {meta.get('runs')} per figure{' (--quick)' if meta.get('quick') == '1' else ''}; "
              f"{meta.get('durations')}; measurements took {meta.get('seconds')} s")
    md.append(f"- **CPU placement:** {meta.get('pinning')} (one CPU per end, as on two hosts: "
              "perftest busy-polls, rdmashim spins briefly before it sleeps; on one shared CPU "
              "nobody can spin, since the peer and the kernel's soft-RoCE work need that CPU)")
    md.append("")
    if mode == "pass-through":
        md.append(f"> **The rdmashim column is the pass-through shim, not RDMA.** {label}: the shim's "
                  "stats files show that every connection stayed on kernel TCP "
                  f"(reasons: {', '.join(f'`{k}` x{n}' for k, n in sorted(tot['reasons'].items())) or 'none'}). "
                  "The RDMA upgrade is not built yet; until it is, this column measures the cost of the "
                  "interposition layer on TCP.")
        md.append("")
    md.append("| figure | unit | kernel TCP | " + label + " | rsocket | device | rdmashim ÷ TCP | rdmashim ÷ rsocket | rdmashim ÷ device |")
    md.append("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for rw in rows_out:
        md.append("| " + " | ".join([rw["label"], rw["unit"]]
                                    + [cell_text(rw["systems"][s], short=False).replace("|", "\\|") for s in SYSTEMS]
                                    + [ratio_text(rw, o) for o in ("tcp", "rsocket", "device")]) + " |")
    md.append("")
    md.append("Each figure is the median of its runs. The systems are measured back to back in each "
              "run (round), and each ratio is the median of the per-run ratios. Every latency and throughput "
              "figure counts only after a warm-up on its connection (see Runs; `sockperf --pre-warmup-wait`, "
              "`iperf3 -O`, sockbench's own): under rdmashim a connection's first ~100 ms here go over TCP "
              "until its upgrade, which is not the steady state the device and rsocket columns measure. "
              "Latencies are one-way "
              "(round trip / 2) in microseconds; `send/recv` is `scripts/bench-tools/sockbench.c` "
              "(plain blocking calls, because sockperf and qperf do not run under rsocket's preload). "
              "Round trips are timed with the CPU's time-stamp counter by all three tools (sockperf "
              "and perftest by default, sockbench too): a monotonic-clock read is a system call "
              "under the VM's HPET clocksource and slowed sockbench's 64 B round trip by ~30 us. "
              "Device column: " + "; ".join(f"`{v}`" for v in DEVICE_TOOL.values()) +
              ". A `*` marks a figure where some runs failed. The connection rate is "
              "`sockbench.c conn` (connect, 64 B echo, close), counted after a warm-up of the same "
              "loop in the same process; in the fallback rows the "
              "server runs without any preload and the TCP column is plain client → plain server. "
              "What a process pays once is measured apart (`sockbench.c first`): a fresh "
              "process's first short connection (connect to echo received), and the CPU time "
              "(user + system, all threads, exec included) of that process after one connection "
              "and 1 s idle, so that a preload's background work for it (loading the RDMA "
              "libraries, the first dial) is counted; each round's figure is the median of "
              "several fresh processes.")
    md.append("")
    md.append(note)
    md.append("")
    if lat_rounds:
        md.append(f"## 64 B latency against the device, {meta.get('lat_rounds', '?')} short rounds")
        md.append("")
        md.append("This VM puts whole runs of any tool, perftest's included, in a fast or a slow "
                  "state (the same binary's one-way latency ~25 us in one run and ~50 us in the "
                  "next; docs/bench/transport.md), so the few runs of the table above cannot tell "
                  "1.0x from 1.3x. Here `ib_write_lat -R -s 64` and rdmashim's two 64 B ping-pongs "
                  "run back to back in many short rounds, their order rotated each round; each "
                  "round gives one ratio (rdmashim's median one-way latency / ib_write_lat's "
                  "t_typical), and the figure is the median of those ratios with a distribution-free "
                  "95% interval (order statistics of the binomial: it assumes only that rounds "
                  f"are independent). The target is {LAT_TARGET}x; a verdict needs the whole interval "
                  "on one side of it. The states of the two tools in a round are independent (a "
                  "round does not share a state), so a round pairing a fast run with a slow one "
                  "gives an extreme ratio either way; \"fast runs\" compares each side's lower "
                  "quartile over the rounds, i.e. their fast runs with each other (descriptive, "
                  "no interval).")
        md.append("")
        md.append("| rdmashim tool | rounds | device, median µs | rdmashim, median µs | ratio, median | 95% interval | quartiles | rounds ≤ "
                  f"{LAT_TARGET}x | fast runs: device / rdmashim µs, ratio | verdict |")
        md.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
        for e in lat_rounds:
            if "median" not in e:
                md.append(f"| {e['tool']} | {e['rounds']} | - | - | - | - | - | - | - | {e['verdict']} |")
                continue
            ci = e["interval"]
            md.append(f"| {e['tool']} | {e['pairs']} of {e['rounds']} | {fmt(e['device_median_us'])} | "
                      f"{fmt(e['shim_median_us'])} | {e['median']:.2f}x | "
                      + (f"{ci['low']:.2f}–{ci['high']:.2f}x ({ci['coverage'] * 100:.1f}%)" if ci else "-")
                      + f" | {e['q1']:.2f}–{e['q3']:.2f}x | {e['at_or_below_target']} of {e['pairs']} | "
                      f"{fmt(e['fast_device_us'])} / {fmt(e['fast_shim_us'])}, {e['fast_ratio']:.2f}x | {e['verdict']} |")
        md.append("")
        seen = set()
        for e in lat_rounds:
            if e["per_round"]:
                md.append(f"- {e['tool']}, per round (rdmashim µs / device µs = ratio): "
                          + "; ".join(f"{p['round']}: {fmt(p['shim_us'])} / {fmt(p['device_us'])} = {p['ratio']:.2f}"
                                      for p in e["per_round"]))
            for f in e["failed"]:
                key = (f["system"], f["round"], f["error"])
                if key not in seen:
                    seen.add(key)
                    md.append(f"- round {f['round']}: {NAMES[f['system']]} failed: {f['error']}")
        md.append("")
    md_failures_and_plots(md, failures, charts)
    md.append("## What these figures mean")
    md.append("")
    md.append("Soft-RoCE (`rdma_rxe`) is RDMA implemented in the kernel on top of an ordinary netdev; "
              "here it runs inside a VM whose CPU is emulated (qemu TCG) on a small shared host. In this "
              "setting RDMA is *slower* than kernel TCP: every RDMA operation is a software packet "
              "through the emulated kernel, with no NIC offload. The absolute figures and the "
              "ratios against kernel TCP therefore say nothing about hardware. What transfers to a "
              "real RDMA NIC are the ratios against the device limit (how much of what the device "
              "can do an unmodified application gets through the shim) and against rsocket (the "
              "same idea, same device, same applications). TCG timings are noisy (timer-tick "
              "outliers): compare medians, and read p99 values as indicative only.")
    md.append("")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))


def md_failures_and_plots(md, failures, charts):
    """Appends the report's Failures section (if any) and its Plots section to md."""
    if failures:
        md.append("## Failures")
        md.append("")
        md.append("A tool that hangs or fails is killed by its timeout, recorded, and not retried in later runs.")
        md.append("")
        for s, t, e, rr in failures:
            md.append(f"- {NAMES[s]} / {', '.join(f'`{x}`' for x in t)} (run {', '.join(map(str, rr))}): {e}")
        md.append("")
    md.append("## Plots")
    md.append("")
    for alt, k in (("latency", "latency"), ("throughput", "throughput"), ("redis", "app")):
        md.append(f"![{alt}]({charts[k]})")
        md.append("")


# ---- same host (scripts/bench --local) ---------------------------------------------------------

def write_charts_local(out, rows_out, label):
    by = {r["id"]: r for r in rows_out}

    def val(rid, s, p99id=None):
        c = by[rid]["systems"].get(s)
        p99 = by[p99id]["systems"][s]["median"] if p99id else None
        return (c["median"], p99, c["failed"])

    series = [("tcp", "kernel TCP, 127.0.0.1"), ("shim", label)]
    lat = [(name, {s: val(f"{rid}_p50", s, f"{rid}_p99") for s, _ in series})
           for name, rid in (("sockperf 64 B", "sockperf_64"), ("send/recv 64 B", "pingpong_64"),
                             ("sockperf 4 KiB", "sockperf_4096"), ("send/recv 4 KiB", "pingpong_4096"),
                             ("sockperf 64 B, one CPU", "sockperf_64_shared"),
                             ("send/recv 64 B, one CPU", "pingpong_64_shared"))]
    with open(os.path.join(out, "latency.svg"), "w") as f:
        f.write(svg_bars("Same host: one-way latency, median (bar) and p99 (marker)", "microseconds", lat,
                         series, True, "ping-pong round trip / 2; one CPU: both ends pinned to the same CPU"))
    tp = [(name, {s: val(rid, s) for s, _ in series})
          for name, rid in (("send/recv stream", "stream"), ("stream, one CPU", "stream_shared"),
                            ("iperf3, 1 stream", "iperf3_P1"), ("iperf3, 4 streams", "iperf3_P4"))]
    with open(os.path.join(out, "throughput.svg"), "w") as f:
        f.write(svg_bars("Same host: throughput", "Gbit/s", tp, series, False, "64 KiB writes"))
    app = [(f"{op} {m}{' 1 CPU' if sfx else ''}", {s: val(f"redis{sfx}_{op}_{mode}", s) for s, _ in series})
           for sfx in ("", "_shared") for mode, m in (("C1", "c1"), ("P1", "c50"), ("P16", "c50 P16"))
           for op in ("SET", "GET")]
    with open(os.path.join(out, "app.svg"), "w") as f:
        f.write(svg_bars("Same host: redis-benchmark requests per second", "requests/s", app, series, True,
                         "c1: one client; c50: 50 clients; P16: 16 requests pipelined"))
    return {"latency": "latency.svg", "throughput": "throughput.svg", "app": "app.svg"}


def write_md_local(out, meta, rows_out, label, mode, note, failures, cell_text, ratio_text, charts):
    md = ["# rdmashim on one host: shared-memory rings against loopback TCP", "",
          "Generated by `scripts/bench --local --publish`. Do not edit by hand. These are real figures "
          "of the machine below (no emulation): both ends run on it, on 127.0.0.1.", "",
          f"- **Date:** {meta.get('date')}",
          f"- **Machine:** {meta.get('nproc')} CPUs, {meta.get('cpu')}; kernel {meta.get('kernel')}",
          f"- **Tools:** {meta.get('tools')}",
          f"- **Runs:** {meta.get('runs')} per figure{' (--quick)' if meta.get('quick') == '1' else ''}; "
          f"{meta.get('durations')}; measurements took {meta.get('seconds')} s",
          f"- **CPU placement:** {meta.get('pinning')}", ""]
    if mode == "pass-through":
        md += [f"> **The rdmashim column is the pass-through shim, not shared memory.** {label}.", ""]
    md.append(f"| figure | unit | kernel TCP | {label} | rdmashim ÷ TCP | target | verdict |")
    md.append("|---|---|--:|--:|--:|--:|---|")
    for rw in rows_out:
        md.append("| " + " | ".join([rw["label"], rw["unit"]]
                                    + [cell_text(rw["systems"][s], short=False).replace("|", "\\|") for s in LOCAL_SYSTEMS]
                                    + [ratio_text(rw, "tcp"), target_text(rw["target"]),
                                       f"**{rw['verdict']}**" if rw["verdict"] == "missed" else (rw["verdict"] or "")]) + " |")
    md.append("")
    md.append("Each figure is the median of its runs; kernel TCP and rdmashim are measured back to back "
              "in each run, and each ratio is the median of the per-run ratios. Every latency and "
              "throughput figure counts only after a warm-up on its connection (`sockperf "
              "--pre-warmup-wait`, `iperf3 -O`, sockbench's own): under the shim a connection starts "
              "on TCP and moves to the rings once both ends agree. Latencies are one-way (round trip "
              "/ 2). `send/recv` is `scripts/bench-tools/sockbench.c` (blocking calls); its CPU time "
              "per round trip adds the client's (user + system, every thread, over the counted round "
              "trips) and the server's (over the whole connection, warm-up included). The memory "
              "row is `sockbench.c hold`: the proportional set size (Pss: a shared page is split "
              "among the processes mapping it) that 100 open connections, each echoed once before and "
              "once after 2 s idle, add to the client and the server together, per connection "
              "(the server holds each in a thread of its own, whose stack counts for both systems). "
              "Targets are the issue's: a 64 B ping-pong at most 1/10 of loopback TCP's latency, a "
              "64 KiB stream at least 3x its throughput, redis-benchmark at least 2x; with both ends "
              "on one CPU, where nobody can spin, never worse than TCP.")
    md.append("")
    md.append(note)
    md.append("")
    md_failures_and_plots(md, failures, charts)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
