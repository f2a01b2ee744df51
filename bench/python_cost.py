#!/usr/bin/env python3
"""What a request costs from Python over the same request from C++, measured in one run.

A target process (python/tests/peer.py, memory from alloc(): same-host peers reach it through
shm) serves 64 MiB. Each round runs request_cost (C++) and then the same requests from Python:
  sync8  a sync 8-byte WRITE (one descriptor, a prebuilt list), mean us per call
  descs  a sync WRITE of 10,000 descriptors of 64 B given as three numpy arrays, mean us
and prints a markdown table: each round's figures and Python/C++ ratios, then the median ratio
(bench/compare_python.sh writes it into bench/RESULTS.md).

    .venv/bin/python bench/python_cost.py [--rounds 5] [--build build]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import xfer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
from conftest import Peer  # noqa: E402


def python_round(peer, n, m, d, b):
    with xfer.Engine("127.0.0.1") as engine:
        engine.connect(peer.name)
        src = np.ones(d * b, np.uint8)
        engine.register(src)  # as request_cost registers its buffer
        one = [(src.ctypes.data, peer.addr, 8)]
        for _ in range(n // 10):
            engine.write(peer.name, one)
        t0 = time.perf_counter()
        for _ in range(n):
            engine.write(peer.name, one)
        sync8 = (time.perf_counter() - t0) / n * 1e6
        local = src.ctypes.data + np.arange(d, dtype=np.uint64) * b
        remote = peer.addr + np.arange(d, dtype=np.uint64) * b
        length = np.full(d, b, np.uint64)
        total = 0.0
        for i in range(m + m // 10):
            r0 = time.perf_counter()
            engine.write(peer.name, local=local, remote=remote, length=length)
            if i >= m // 10:
                total += time.perf_counter() - r0
        return {"sync8_us": sync8, "descs_us": total / m * 1e6}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--calls", type=int, default=200000, help="8-byte WRITEs per round")
    p.add_argument("--requests", type=int, default=300, help="10,000-descriptor WRITEs per round")
    p.add_argument("--rounds-file", help="also write each round's figures there, as bench/lib.sh's "
                   "round_stats reads them (<round> <key> <bytes> <us>)")
    a = p.parse_args()
    d, b = 10000, 64
    peer = Peer(memory="alloc", nbytes=64 << 20)
    ratios = {"sync8_us": [], "descs_us": []}
    py_sync8 = []
    try:
        print("| round | sync 8 B WRITE, C++ us | Python us | Python / C++ | 10,000 x 64 B WRITE, C++ us | Python us | Python / C++ |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in range(a.rounds):
            out = subprocess.run([os.path.join(a.build, "bench", "request_cost"), peer.name, str(peer.addr),
                                  str(a.calls), str(a.requests), str(d), str(b)],
                                 check=True, capture_output=True, text=True).stdout
            cpp = json.loads(out)
            py = python_round(peer, a.calls, a.requests, d, b)
            for k in ratios:
                ratios[k].append(py[k] / cpp[k])
            print(f"| {r + 1} | {cpp['sync8_us']:.3f} | {py['sync8_us']:.3f} | {ratios['sync8_us'][-1]:.2f}"
                  f" | {cpp['descs_us']:.1f} | {py['descs_us']:.1f} | {ratios['descs_us'][-1]:.2f} |", flush=True)
            py_sync8.append(py["sync8_us"])
            if a.rounds_file:
                with open(a.rounds_file, "a") as f:
                    for side, got in (("cpp", cpp), ("py", py)):
                        f.write(f"{r + 1} {side}_sync8 8 {got['sync8_us']}\n{r + 1} {side}_descs {d * b} {got['descs_us']}\n")
    finally:
        peer.close()
    print()
    print(f"Sync 8-byte WRITE from Python: median {statistics.median(py_sync8):.3f} us (highest round "
          f"{max(py_sync8):.3f} us; goal: under 2 us).")
    for k, what in (("sync8_us", "sync 8-byte WRITE"), ("descs_us", "10,000-descriptor WRITE from numpy arrays")):
        v = ratios[k]
        print(f"{what}: Python / C++ median {statistics.median(v):.2f} (rounds {min(v):.2f}-{max(v):.2f}).")


if __name__ == "__main__":
    main()
