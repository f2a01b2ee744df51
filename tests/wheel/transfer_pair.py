"""Two processes move bytes with an installed xfer (no numpy, nothing but the package).

    transfer_pair.py TRANSPORT            the initiator: starts the target itself
    transfer_pair.py TRANSPORT --target   the target: serves 1 MiB of Engine.alloc memory

The initiator READs the target's pattern, WRITEs its own, and the target checks it; the route
must be TRANSPORT (forced on both sides). Exits 0 when every byte was right.
"""

import ctypes
import json
import subprocess
import sys

import xfer

SIZE = 1 << 20


def pattern(seed):
    return bytes((seed + i * 7) % 256 for i in range(256)) * (SIZE // 256)


def target(transport):
    with xfer.Engine("127.0.0.1:0", transport=transport) as engine:
        memory = engine.alloc(SIZE, tag="pool")
        ctypes.memmove(memory.addr, pattern(1), SIZE)
        print(json.dumps({"name": engine.name, "addr": memory.addr}), flush=True)
        sys.stdin.readline()  # the initiator is done
        landed = ctypes.string_at(memory.addr, SIZE) == pattern(2)
        print(json.dumps({"landed": landed}), flush=True)


def initiator(transport):
    child = subprocess.Popen([sys.executable, __file__, transport, "--target"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        peer = json.loads(child.stdout.readline())
        with xfer.Engine("127.0.0.1", transport=transport) as engine:
            local = bytearray(SIZE)
            region = engine.register(local)
            engine.connect(peer["name"], timeout=10)
            engine.read(peer["name"], [(region.addr, peer["addr"], SIZE)], timeout=10)
            if bytes(local) != pattern(1):
                sys.exit(f"{transport}: READ brought the wrong bytes")
            local[:] = pattern(2)
            engine.write(peer["name"], [(region.addr, peer["addr"], SIZE)], timeout=10)
            route = engine.peer_info(peer["name"]).transport
        child.stdin.write("done\n")
        child.stdin.flush()
        if not json.loads(child.stdout.readline())["landed"]:
            sys.exit(f"{transport}: the target did not find the WRITE's bytes")
        if route != transport:
            sys.exit(f"{transport}: the bytes went over {route}")
        print(f"{transport}: READ and WRITE of {SIZE} bytes between two processes: ok (xfer {xfer.__version__})")
    finally:
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    (target if sys.argv[2:] == ["--target"] else initiator)(sys.argv[1])
