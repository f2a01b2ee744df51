"""The decode side READs a prefill server's KV blocks, then tells it "free 17-42": the prefill
server learns from the notification alone that the blocks are copied and may be reused. A
notification is delivered only after every byte of its request has been read, so the prefill
server can overwrite the blocks the moment it sees the message.

    terminal 1:  python kv_read_free.py prefill 127.0.0.1:5555   (exits after one request)
    terminal 2:  python kv_read_free.py decode  127.0.0.1:5555
"""

import sys

import numpy as np

import xfer

BLOCK, BLOCKS = 64 << 10, 64
FIRST, LAST = 17, 42  # the request's blocks


def prefill(name):
    with xfer.Engine(name) as engine:
        pool = engine.alloc(BLOCK * BLOCKS, tag="kv-pool")
        blocks = np.frombuffer(pool, np.uint8).reshape(BLOCKS, BLOCK)
        blocks[:] = np.arange(BLOCKS, dtype=np.uint8)[:, None]  # block b holds bytes b
        print(f"prefill: {BLOCKS} blocks at {engine.name}; waiting for the decode side to free some",
              flush=True)
        (note,) = engine.wait_notifies(timeout=60)[:1] or [None]
        if note is None:
            sys.exit("prefill: no notification within 60 s")
        first, last = map(int, note.message.decode().removeprefix("free ").split("-"))
        blocks[first:last + 1] = 0xFF  # the READ is over: reuse the blocks at once
        print(f"prefill: {note.sender} says '{note.message.decode()}': blocks reused")
        del blocks  # (a view of the pool: the engine closes only once none is left)


def decode(remote):
    with xfer.Engine(remote.rpartition(":")[0]) as engine:
        engine.connect(remote, timeout=10)
        pool = next(r for r in engine.remote_regions(remote) if r.tag == "kv-pool")
        ids = np.arange(FIRST, LAST + 1, dtype=np.uint64)
        cache = np.zeros((len(ids), BLOCK), np.uint8)
        # Completed = every block is here and the prefill side has queued "free 17-42".
        engine.read(remote, local=cache.ctypes.data + np.arange(len(ids), dtype=np.uint64) * BLOCK,
                    remote=pool.addr + ids * BLOCK, length=BLOCK, timeout=10,
                    notify=f"free {FIRST}-{LAST}")
        if not (cache == ids.astype(np.uint8)[:, None]).all():
            sys.exit("decode: wrong data")
        print(f"decode: read blocks {FIRST}-{LAST} and told the prefill side to free them")


if __name__ == "__main__":
    roles = {"prefill": prefill, "decode": decode}
    if len(sys.argv) != 3 or sys.argv[1] not in roles:
        sys.exit(f"usage: {sys.argv[0]} prefill HOST:PORT | decode HOST:PORT")
    roles[sys.argv[1]](sys.argv[2])
