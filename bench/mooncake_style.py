#!/usr/bin/env python3
"""One Mooncake-style program, run against mooncake.engine.TransferEngine (--impl mooncake) or
xfer.mooncake.TransferEngine (--impl xfer) by bench/compare_mooncake.sh.

It starts a target (python/tests/mooncake_target.py, which initializes and allocates a managed
buffer), then for each block size: sync single-block WRITEs and READs, batched sync WRITE and
READ, batched async WRITE and READ (get_batch_transfer_status). Each READ lands in a cleared
buffer and is compared with what was written. Prints one JSON object: per step the return code
(0, or "negative"), whether the data came back equal, a hash of it, and GB/s (1e9 B/s) after a
few untimed warm-up calls.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOL = 64 << 20


def code(rc):
    return 0 if rc == 0 else "negative"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["xfer", "mooncake"], required=True)
    p.add_argument("--sizes", default="4096,65536,1048576,8388608")
    p.add_argument("--bytes", type=int, default=64 << 20, help="moved per step and size")
    a = p.parse_args()
    if a.impl == "xfer":
        from xfer.mooncake import TransferEngine, TransferOpcode
    else:
        from mooncake.engine import TransferEngine, TransferOpcode
    target = subprocess.Popen([sys.executable, os.path.join(ROOT, "python", "tests", "mooncake_target.py"),
                               "--impl", a.impl, "--allocate", str(POOL)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    steps = []
    try:
        hello = json.loads(target.stdout.readline())
        segment = hello["segment"]
        engine = TransferEngine()
        rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        remote = engine.get_first_buffer_address(segment)
        local = engine.allocate_managed_buffer(POOL)
        steps.append({"step": "set-up", "rc": code(rc), "target_rc": code(hello["rc"]),
                      "remote_nonzero": remote != 0, "local_nonzero": local != 0})

        def run(name, size, fn, nbytes, reps):
            for _ in range(min(reps, 8)):  # warm-up: connections, page faults
                fn()
            t0 = time.perf_counter()
            rcs = [fn() for _ in range(reps)]
            seconds = time.perf_counter() - t0
            rc = next((r for r in rcs if r != 0), 0)
            return {"step": name, "size": size, "rc": code(rc), "gbps": round(nbytes * reps / seconds / 1e9, 3)}

        for size in map(int, a.sizes.split(",")):
            count = min(POOL // size, 256)
            span = count * size
            reps = max(2, a.bytes // span)
            data = hashlib.sha256(str(size).encode()).digest() * (span // 32 + 1)
            data = data[:span]
            bufs = [local + k * size for k in range(count)]
            peers = [remote + k * size for k in range(count)]
            lengths = [size] * count

            def clear():
                engine.write_bytes_to_buffer(local, bytes(span), span)

            def check(step, nbytes=span):
                back = engine.read_bytes_from_buffer(local, nbytes)
                step["data_equal"] = back == data[:nbytes]
                step["sha"] = hashlib.sha1(back).hexdigest()[:12]
                return step

            engine.write_bytes_to_buffer(local, data, span)
            one = max(2, min(4096, a.bytes // size // 4))  # single-block steps: a quarter of the bytes
            steps.append(run("sync write 1 block", size, lambda: engine.transfer_sync_write(segment, local, remote, size), size, one))
            steps.append(run("batch sync write", size, lambda: engine.batch_transfer_sync_write(segment, bufs, peers, lengths), span, reps))
            clear()
            steps.append(check(run("batch sync read", size, lambda: engine.batch_transfer_sync_read(segment, bufs, peers, lengths), span, reps)))
            clear()
            steps.append(check(run("sync read 1 block", size, lambda: engine.transfer_sync_read(segment, local, remote, size), size, one), size))
            engine.write_bytes_to_buffer(local, data, span)

            def async_move(opcode):
                batch = engine.batch_transfer_async(segment, bufs, peers, lengths, opcode)
                return -1 if batch == 0 else engine.get_batch_transfer_status([batch])

            steps.append(run("batch async write", size, lambda: async_move(TransferOpcode.Write), span, reps))
            clear()
            steps.append(check(run("batch async read", size, lambda: async_move(TransferOpcode.Read), span, reps)))
        far = remote + (8 << 30)  # beyond every registered buffer of the target
        steps.append({"step": "write outside the target's buffers",
                      "rc": code(engine.transfer_sync_write(segment, local, far, 4096))})
    finally:
        target.stdin.write('["exit"]\n')
        target.stdin.flush()
        target.wait(30)
    print(json.dumps({"impl": a.impl, "transport": os.environ.get("XFER_MOONCAKE_TRANSPORT", ""), "steps": steps}))


if __name__ == "__main__":
    main()
