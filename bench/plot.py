#!/usr/bin/python3
"""Draws benchmark results: bandwidth against block size, and the paired ratios of the compare
scripts.

    /usr/bin/python3 bench/plot.py [-o OUT] [--title TEXT] [--latency] FILE.json[=LABEL] ...
                                   [--dashed FILE.json[=LABEL] ...] [--reference SPEC ...]
    /usr/bin/python3 bench/plot.py --stats STATS [--curves REGEX] [--baseline REGEX]
                                   [--name KEY=LABEL ...] [--unit UNIT] [--reference SPEC ...]
                                   [-o OUT] [--title TEXT]
    /usr/bin/python3 bench/plot.py --grid TABLE.json [-o OUT] [--title TEXT]

xfer-bench files: each FILE.json is what `xfer-bench ... --json FILE.json` wrote; LABEL
(default: the file's name; "FILE.json=" for none) prefixes its lines, one per op and route;
--dashed files are drawn dashed (baselines, earlier builds); --latency adds p50 and p99 latency.

--stats: what bench/lib.sh's round_stats wrote ("<key> <bytes> <median>" and, per pair,
"<A>/<B> <bytes> <median> <lowest> <highest>"): every key measured at two or more block sizes
is a line (those matching --curves, when given; keys matching --baseline dashed; --name renames
them), and the pairs' ratios are bars with their rounds' range under it.

--grid: the cells of `xfer-bench table --json TABLE.json`, drawn as HIXL's table is laid out:
one small plot per direction and op, a line per transport and path, and HIXL's own A3 figures
(bench/reference/hixl_a3_bandwidth.tsv) dashed beside them.

--reference FILE.tsv[:COLUMN=VALUE,...][@LABEL]: the rows of one of bench/reference's tables
that match, drawn dashed and grey (GB/s; perftest's Gb/s are converted).

Writes OUT as given when it ends in .png, .svg or .pdf, else OUT.png and OUT.svg (OUT defaults
to "plot"). Block sizes go on a log2 axis labelled in
KiB/MiB; GB/s = 1e9 bytes/s. Needs matplotlib (Debian's python3-matplotlib: /usr/bin/python3).
"""

import argparse
import csv
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(why):
    sys.exit(f"plot.py: {why}")


# ------------------------------------------------------------------------------ inputs
def read_bench(spec):
    """(label, rows) of FILE.json[=LABEL]; exits saying why when it is not xfer-bench's."""
    path, given, label = spec.partition("=")
    try:
        with open(path) as f:
            doc = json.load(f)
        rows = doc["rows"]
        if not isinstance(rows, list) or not all("bytes" in r and "bw_avg_GBps" in r for r in rows):
            raise KeyError("rows")
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path} is not an xfer-bench --json file ({type(e).__name__}: {e})")
    return label if given else os.path.splitext(os.path.basename(path))[0], rows


def bench_series(label, rows):
    """{line name: [(bytes, row), ...] sorted by bytes}."""
    out = {}
    for r in rows:
        parts = ([label] if label else []) + [r.get("op", "?"), route(r)]
        if r.get("path") not in (None, "direct"):
            parts.append(r["path"])
        if r.get("dir"):
            parts.append(r["dir"])
        out.setdefault(" ".join(parts), []).append((r["bytes"], r))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in out.items()}


def route(row):
    """Where most of the row's bytes went: shm, cuda, staged (the buffer pool) or the peer's
    transport (xfer-bench's "# path:" line)."""
    moved = {"shm": row.get("shm_bytes", 0), "cuda": row.get("cuda_bytes", 0),
             "staged": row.get("staged_bytes", 0), row.get("transport") or "?": row.get("transport_bytes", 0)}
    best = max(moved, key=lambda k: moved[k] or 0)
    return best if moved[best] else (row.get("transport") or "?")


def read_stats(path):
    """(values {key: {bytes: median}}, ratios [(pair, bytes, median, lowest, highest)])."""
    values, ratios = {}, []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                w = line.split()
                if len(w) == 3 and "/" not in w[0]:
                    values.setdefault(w[0], {})[int(w[1])] = float(w[2])
                elif len(w) == 5 and "/" in w[0]:
                    ratios.append((w[0], int(w[1]), *map(float, w[2:])))
                elif w:
                    raise ValueError(f"line {n}: {line.strip()!r}")
    except (OSError, ValueError) as e:
        fail(f"{path} is not round_stats output ({e})")
    return values, ratios


def to_bytes(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if not m:
        raise ValueError(f"bad block size {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def read_reference(spec):
    """(label, [(bytes, GB/s)]) of FILE.tsv[:COLUMN=VALUE,...][@LABEL]: the rows of a table of
    bench/reference (a bare file name is looked up there) that match every filter."""
    spec, _, label = spec.partition("@")
    path, _, filters = spec.partition(":")
    if not os.path.exists(path) and os.path.exists(os.path.join(HERE, "reference", path)):
        path = os.path.join(HERE, "reference", path)
    try:
        want = dict(f.split("=", 1) for f in filters.split(",") if f)
        with open(path) as f:
            rows = list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))
        points = []
        for r in rows:
            if any(r.get(k) != v for k, v in want.items()):
                continue
            x = int(r["bytes"]) if r.get("bytes") else to_bytes(r["block"])
            if r.get("GBps"):
                points.append((x, float(r["GBps"])))
            elif r.get("bw_avg_Gbps"):
                points.append((x, float(r["bw_avg_Gbps"]) / 8))
    except (OSError, ValueError, KeyError) as e:
        fail(f"reference {spec}: {type(e).__name__}: {e}")
    if not points:
        fail(f"reference {spec}: no row matches")
    return label or " ".join([os.path.basename(path).split(".")[0]] + list(want.values())), sorted(points)


# ------------------------------------------------------------------------------ drawing
def size_label(n, _pos=None):
    n = int(round(n))
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}"


def size_axis(ax, FuncFormatter):
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    ax.set_xlabel("block size (bytes)")
    ax.grid(True, which="both", alpha=0.3)


def draw_references(ax, refs):
    for k, (name, points) in enumerate(refs):
        ax.plot([x for x, _ in points], [y for _, y in points], ("--", ":", "-.")[k % 3], color="grey",
                alpha=0.8, linewidth=1.2, label=f"{name} (reference)")


def draw_ratios(ax, ratios):
    """Horizontal bars: each pair's median ratio, its rounds' range as a whisker, 1.0 marked;
    pairs in the order they were named, each by block size."""
    order = {}
    for pair, *_ in ratios:
        order.setdefault(pair, len(order))
    ratios = sorted(ratios, key=lambda r: (order[r[0]], r[1]))
    labels = [f"{pair} @ {size_label(b)}" for pair, b, *_ in ratios]
    med = [m for _, _, m, _, _ in ratios]
    err = [[m - lo for _, _, m, lo, _ in ratios], [hi - m for _, _, m, _, hi in ratios]]
    ys = range(len(ratios))
    ax.barh(ys, med, xerr=err, color="tab:blue", alpha=0.7, ecolor="black", capsize=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(ys), labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("paired ratio: median of the rounds (whisker: lowest-highest round)")
    ax.grid(True, axis="x", alpha=0.3)


def grid(plt, FuncFormatter, cells, title):
    """HIXL's table shape: rows = directions, columns = ops; HIXL's A3 figures dashed."""
    directions = [d for d in ("D2D", "H2D", "D2H", "H2H") if any(c["direction"] == d for c in cells)]
    ops = [o for o in ("write", "read") if any(c["op"] == o for c in cells)]
    if not directions or not ops:
        fail("the table holds no cells")
    fig, axes = plt.subplots(len(directions), len(ops), figsize=(5 * len(ops), 3.2 * len(directions)),
                             squeeze=False, sharex=True)
    with open(os.path.join(HERE, "reference", "hixl_a3_bandwidth.tsv")) as f:
        hixl = list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))
    scenario = cells[0].get("scenario", "single_machine")
    for i, d in enumerate(directions):
        for j, o in enumerate(ops):
            ax = axes[i][j]
            lines = {}
            for c in cells:
                if c["direction"] == d and c["op"] == o and c.get("GBps") is not None:
                    lines.setdefault(f'{c["transport"]} {c["path"]}', []).append((c["bytes"], c["GBps"]))
            for name, points in sorted(lines.items()):
                points.sort()
                ax.plot([x for x, _ in points], [y for _, y in points], "-", marker="o", markersize=3, label=name)
            for k, (transport, path) in enumerate((t, p) for t in ("HCCS", "RDMA") for p in ("direct", "bufferpool")):
                points = [(to_bytes(r["block"]), float(r["GBps"])) for r in hixl
                          if (r["scenario"], r["op"], r["transport"], r["direction"], r["path"]) ==
                          (scenario, o, transport, d, path) and r["GBps"]]
                if points:
                    ax.plot([x for x, _ in points], [y for _, y in points], linestyle=("--", ":", "-.", (0, (5, 1, 1, 1)))[k],
                            color="grey", alpha=0.8, linewidth=1, label=f"HIXL A3 {transport} {path}")
            size_axis(ax, FuncFormatter)
            ax.set_title(f"{o.upper()} {d}", fontsize="medium")
            ax.set_ylabel("GB/s")
            ax.set_ylim(bottom=0)
            if ax.lines:
                ax.legend(fontsize="x-small")
            else:
                ax.text(0.5, 0.5, "n/a here", transform=ax.transAxes, ha="center", color="grey")
    fig.suptitle(title)
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", metavar="FILE.json[=LABEL]")
    p.add_argument("--dashed", nargs="*", default=[], metavar="FILE.json[=LABEL]")
    p.add_argument("--stats", metavar="STATS", help="round_stats output of a compare script")
    p.add_argument("--baseline", default="^$", metavar="REGEX", help="--stats keys drawn dashed")
    p.add_argument("--curves", default="", metavar="REGEX", help="--stats keys drawn as lines (default: all)")
    p.add_argument("--name", action="append", default=[], metavar="KEY=LABEL", help="--stats: a key's label")
    p.add_argument("--unit", default="GB/s", help="--stats: the unit of the values")
    p.add_argument("--grid", metavar="TABLE.json", help="xfer-bench table --json output")
    p.add_argument("--reference", action="append", default=[], metavar="FILE.tsv[:COL=VAL,...][@LABEL]")
    p.add_argument("-o", "--out", default="plot",
                   help="output file (.png, .svg or .pdf), or a path without extension: OUT.png and OUT.svg")
    p.add_argument("--title", default="xfer-bench")
    p.add_argument("--latency", action="store_true", help="also p50/p99 latency against block size")
    a = p.parse_args()
    if bool(a.files) + bool(a.stats) + bool(a.grid) != 1:
        p.error("give xfer-bench files, or --stats, or --grid (one of them)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        fail("needs matplotlib (apt-get install python3-matplotlib; run with /usr/bin/python3)")
    refs = [read_reference(r) for r in a.reference]

    if a.grid:
        try:
            with open(a.grid) as f:
                cells = json.load(f)["table"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{a.grid} is not an xfer-bench table --json file ({type(e).__name__}: {e})")
        fig = grid(plt, FuncFormatter, cells, a.title)
    elif a.stats:
        values, ratios = read_stats(a.stats)
        names = dict(n.split("=", 1) for n in a.name)
        curves = {k: sorted(v.items()) for k, v in values.items() if len(v) >= 2 and re.search(a.curves, k)}
        panels = bool(curves) + bool(ratios)
        if not panels:
            fail(f"{a.stats} holds nothing to draw")
        heights = ([4.8] if curves else []) + ([max(2.0, 0.28 * len(ratios) + 1)] if ratios else [])
        fig, axes = plt.subplots(panels, 1, figsize=(8, sum(heights)), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        if curves:
            ax = axes[0][0]
            for k, points in sorted(curves.items()):
                ax.plot([x for x, _ in points], [y for _, y in points],
                        "--" if re.search(a.baseline, k) else "-", marker="o", markersize=3, label=names.get(k, k))
            draw_references(ax, refs)
            size_axis(ax, FuncFormatter)
            ax.set_ylabel(a.unit + " (median of the rounds)")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize="small")
            ax.set_title(a.title)
        if ratios:
            draw_ratios(axes[-1][0], ratios)
            if not curves:
                axes[-1][0].set_title(a.title)
    else:
        fig, axes = plt.subplots(2 if a.latency else 1, 1, figsize=(8, 8 if a.latency else 4.8), squeeze=False)
        bw, lat = axes[0][0], axes[1][0] if a.latency else None
        drawn = [(s, False) for s in a.files] + [(s, True) for s in a.dashed]
        for spec, dashed in drawn:
            label, rows = read_bench(spec)
            for name, points in bench_series(label, rows).items():
                xs = [b for b, _ in points]
                style = "--" if dashed else "-"
                line, = bw.plot(xs, [r["bw_avg_GBps"] for _, r in points], style, marker="o", markersize=3, label=name)
                with_lat = [(b, r["lat_us"]) for b, r in points if r.get("lat_us")]
                if lat is not None and with_lat:
                    lat.plot([b for b, _ in with_lat], [l["p50"] for _, l in with_lat], style, marker="o",
                             markersize=3, color=line.get_color(), label=f"{name} p50")
                    lat.plot([b for b, _ in with_lat], [l["p99"] for _, l in with_lat], ":", marker="x",
                             markersize=3, color=line.get_color(), label=f"{name} p99")
        if not bw.lines:
            fail("the files hold no rows")
        draw_references(bw, refs)
        for ax in [bw] + ([lat] if lat is not None else []):
            size_axis(ax, FuncFormatter)
            ax.legend(fontsize="small")
        bw.set_ylabel("bandwidth (GB/s)")
        bw.set_ylim(bottom=0)
        bw.set_title(a.title)
        if lat is not None:
            lat.set_yscale("log")
            lat.set_ylabel("latency per request (us)")
    fig.tight_layout()
    written = output_files(a.out)
    for path in written:
        fig.savefig(path, dpi=110)
    print("plot.py: wrote " + " and ".join(written))


def output_files(out):
    """The files -o OUT names: OUT itself when it has an image extension, else OUT.png and OUT.svg."""
    if os.path.splitext(out)[1].lower() in (".png", ".svg", ".pdf"):
        return [out]
    return [f"{out}.png", f"{out}.svg"]


if __name__ == "__main__":
    main()
