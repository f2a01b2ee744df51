"""A target process for the Python tests: an engine that serves memory and does what the test
asks on stdin, one JSON command per line, one JSON answer per line.

    peer.py --memory alloc|register --bytes N [--read-only] [--option key=value ...]

It prints {"name", "addr", "len"} once its memory is registered. alloc: Engine.alloc (same-host
peers map it: shm); register: a numpy array of its own (same-host peers reach it through cma);
--read-only: peers may READ it but not WRITE it.
Commands: ["sha", offset, len] -> {"sha"}; ["fill", offset, len, byte] -> {}; ["notifies", n,
timeout] -> {"notifies": [[sender, incarnation, message hex]...]} once n came or timeout passed.
"""

import argparse
import ctypes
import hashlib
import json
import sys

import numpy as np

import xfer


def option(text):
    key, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value, value)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--memory", choices=["alloc", "register"], default="alloc")
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--option", type=option, action="append", default=[])
    a = p.parse_args()
    engine = xfer.Engine("127.0.0.1:0", **dict(a.option))
    if a.memory == "alloc":
        memory = engine.alloc(a.bytes, tag="pool", read_only=a.read_only)
        addr = memory.addr
    else:
        memory = np.zeros(a.bytes, np.uint8)
        addr = engine.register(memory, tag="pool", read_only=a.read_only).addr
    print(json.dumps({"name": engine.name, "addr": addr, "len": a.bytes}), flush=True)
    received = []
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd[0] == "sha":
            out = {"sha": hashlib.sha1(ctypes.string_at(addr + cmd[1], cmd[2])).hexdigest()}
        elif cmd[0] == "fill":
            ctypes.memset(addr + cmd[1], cmd[3], cmd[2])
            out = {}
        elif cmd[0] == "notifies":
            received += engine.get_notifies()
            while len(received) < cmd[1]:
                got = engine.wait_notifies(timeout=cmd[2])
                if not got:
                    break
                received += got
            out = {"notifies": [[n.sender, n.sender_incarnation, n.message.hex()] for n in received]}
            received = []
        elif cmd[0] == "exit":
            break
        print(json.dumps(out), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
