#!/usr/bin/python3
"""Draws xfer-bench results: bandwidth against block size, one line per op and transport (and
direction, for bidirectional runs), and with --latency the p50 and p99 latency under it.

    /usr/bin/python3 bench/plot.py [-o OUT] [--title TEXT] [--latency] FILE.json[=LABEL] ...
                                   [--dashed FILE.json[=LABEL] ...]

Each FILE.json is what `xfer-bench ... --json FILE.json` wrote; LABEL (default: the file's
name; "FILE.json=" for none) prefixes its lines. --dashed files are drawn dashed: baselines and earlier builds. Writes
OUT.png and OUT.svg (OUT defaults to "plot"). Block sizes go on a log2 axis labelled in
KiB/MiB; GB/s = 1e9 bytes/s, as xfer-bench reports them. Needs matplotlib (Debian's
python3-matplotlib: run it with /usr/bin/python3).
"""

import argparse
import json
import os
import sys


def read(spec):
    """(label, rows) of FILE.json[=LABEL]; exits 2 saying why when it is not xfer-bench's."""
    path, given, label = spec.partition("=")
    try:
        with open(path) as f:
            doc = json.load(f)
        rows = doc["rows"]
        if not isinstance(rows, list) or not all("bytes" in r and "bw_avg_GBps" in r for r in rows):
            raise KeyError("rows")
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot.py: {path} is not an xfer-bench --json file ({type(e).__name__}: {e})")
    return label if given else os.path.splitext(os.path.basename(path))[0], rows


def series(label, rows):
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


def size_label(n, _pos=None):
    n = int(round(n))
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", metavar="FILE.json[=LABEL]")
    p.add_argument("--dashed", nargs="*", default=[], metavar="FILE.json[=LABEL]")
    p.add_argument("-o", "--out", default="plot", help="output path without extension")
    p.add_argument("--title", default="xfer-bench")
    p.add_argument("--latency", action="store_true", help="also p50/p99 latency against block size")
    a = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        sys.exit("plot.py: needs matplotlib (apt-get install python3-matplotlib; run with /usr/bin/python3)")

    drawn = [(s, False) for s in a.files] + [(s, True) for s in a.dashed]
    fig, axes = plt.subplots(2 if a.latency else 1, 1, figsize=(8, 8 if a.latency else 4.8), squeeze=False)
    bw, lat = axes[0][0], axes[1][0] if a.latency else None
    sizes = set()
    for spec, dashed in drawn:
        label, rows = read(spec)
        for name, points in series(label, rows).items():
            xs = [b for b, _ in points]
            sizes.update(xs)
            style = "--" if dashed else "-"
            line, = bw.plot(xs, [r["bw_avg_GBps"] for _, r in points], style, marker="o", markersize=3, label=name)
            if lat is not None:
                with_lat = [(b, r["lat_us"]) for b, r in points if r.get("lat_us")]
                if with_lat:
                    lat.plot([b for b, _ in with_lat], [l["p50"] for _, l in with_lat], style, marker="o",
                             markersize=3, color=line.get_color(), label=f"{name} p50")
                    lat.plot([b for b, _ in with_lat], [l["p99"] for _, l in with_lat], ":", marker="x",
                             markersize=3, color=line.get_color(), label=f"{name} p99")
    if not sizes:
        sys.exit("plot.py: the files hold no rows")
    for ax in [bw] + ([lat] if lat is not None else []):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
        ax.set_xlabel("block size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    bw.set_ylabel("bandwidth (GB/s)")
    bw.set_ylim(bottom=0)
    bw.set_title(a.title)
    if lat is not None:
        lat.set_yscale("log")
        lat.set_ylabel("latency per request (us)")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{a.out}.{ext}", dpi=110)
    print(f"plot.py: wrote {a.out}.png and {a.out}.svg")


if __name__ == "__main__":
    main()
