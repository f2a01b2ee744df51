"""The prefill side WRITEs a request's KV blocks into a decode server, then tells it "request 7
ready": the notification arrives only after every byte has landed in the decode server's
memory, so the decode server may use the blocks the moment it sees the message.

    terminal 1:  python kv_write_ready.py decode  127.0.0.1:5556   (exits after one request)
    terminal 2:  python kv_write_ready.py prefill 127.0.0.1:5556
"""

import sys

import numpy as np

import xfer

BLOCK, BLOCKS = 64 << 10, 32
REQUEST, SLOTS = 7, [3, 9, 10, 11, 20]  # the decode server's free blocks given to request 7


def decode(name):
    with xfer.Engine(name) as engine:
        pool = engine.alloc(BLOCK * BLOCKS, tag="kv-pool")
        print(f"decode: {BLOCKS} free blocks at {engine.name}; waiting for a request's blocks",
              flush=True)
        (note,) = engine.wait_notifies(timeout=60)[:1] or [None]
        if note is None:
            sys.exit("decode: no notification within 60 s")
        blocks = np.frombuffer(pool, np.uint8).reshape(BLOCKS, BLOCK)
        # The message says the blocks are here: check them (block k of the request holds k + 1).
        ok = all((blocks[slot] == k + 1).all() for k, slot in enumerate(SLOTS))
        print(f"decode: {note.sender} says '{note.message.decode()}': blocks {SLOTS} "
              f"{'hold the request' if ok else 'are WRONG'}")
        del blocks
        sys.exit(0 if ok else 1)


def prefill(remote):
    with xfer.Engine(remote.rpartition(":")[0]) as engine:
        engine.connect(remote, timeout=10)
        pool = next(r for r in engine.remote_regions(remote) if r.tag == "kv-pool")
        kv = np.repeat(np.arange(1, len(SLOTS) + 1, dtype=np.uint8)[:, None], BLOCK, axis=1)
        engine.write(remote, local=kv.ctypes.data + np.arange(len(SLOTS), dtype=np.uint64) * BLOCK,
                     remote=pool.addr + np.array(SLOTS, np.uint64) * BLOCK, length=BLOCK,
                     timeout=10, notify=f"request {REQUEST} ready")
        print(f"prefill: wrote request {REQUEST}'s {len(SLOTS)} blocks and said so")


if __name__ == "__main__":
    roles = {"prefill": prefill, "decode": decode}
    if len(sys.argv) != 3 or sys.argv[1] not in roles:
        sys.exit(f"usage: {sys.argv[0]} decode HOST:PORT | prefill HOST:PORT")
    roles[sys.argv[1]](sys.argv[2])
