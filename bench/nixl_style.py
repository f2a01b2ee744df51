#!/usr/bin/env python3
"""One NIXL-style program (vLLM's prepped flow), run on NIXL's own agent (--impl nixl) or on
xfer.nixl (--impl xfer) by bench/compare_nixl.sh; --impl direct sets up through xfer.nixl and
then moves the same blocks with the agent's xfer engine directly, posted and polled the same
way (read_async, then done() until it is): what the layer costs.

It starts a target (this file, --role target) whose agent listens on a free port and registers
a 64 MiB pool; the metadata goes both ways through the listener and the pool's descriptors come
back as a notification, as in NIXL's examples. Then for each block size: prep_xfer_dlist of
both pools cut into blocks, and READs of `count` blocks (1,000, or as many as fit) by
make_prepped_xfer, one at a time, each polled with check_xfer_state until DONE, after two
untimed warm-ups. Prints one JSON object: per size the blocks per request, GB/s (1e9 B/s) and
whether the last READ's bytes are the pool's.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
from nixl_peer import wait_for  # noqa: E402

POOL = 64 << 20


def agent_types(impl):
    if impl in ("xfer", "direct"):
        import xfer.nixl
        xfer.nixl.install()
    from nixl._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def pattern():
    return (np.arange(POOL, dtype=np.uint64) % 251).astype(np.uint8)


def target(impl, port):
    agent_type, config_type = agent_types(impl)
    agent = agent_type("target", config_type(True, True, port))
    pool = pattern()
    reg = agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
    print(json.dumps({"ready": True}), flush=True)
    wait_for("initiator metadata", lambda: agent.check_remote_metadata("initiator"), 60)
    agent.send_notif("initiator", agent.get_serialized_descs(reg.trim()))
    wait_for("bye", lambda: agent.check_remote_xfer_done("initiator", b"bye"), timeout=600)
    agent.deregister_memory(reg)


def initiator(impl, sizes, count, nbytes):
    agent_type, config_type = agent_types(impl)
    with socket.socket() as s:  # (a free port for the target's listener: NIXL 1.5 cannot say which it took)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "target",
                              "--impl", impl, "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:  # (NIXL logs to stdout too)
            if line.startswith("{"):
                break
        agent = agent_type("initiator", config_type(True, True, 0))
        pool = np.zeros(POOL, np.uint8)
        reg = agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
        agent.fetch_remote_metadata("target", "127.0.0.1", port)
        agent.send_local_metadata("127.0.0.1", port)
        note = wait_for("the target's descriptors", lambda: agent.get_new_notifs().get("target"), 60)
        remote_pool = agent.deserialize_descs(note[0])[0]
        wait_for("target metadata", lambda: agent.check_remote_metadata("target"), 60)
        steps = [run_size(agent, impl, pool, remote_pool[0], size, count, nbytes) for size in sizes]
        agent.send_notif("target", b"bye")
        agent.deregister_memory(reg)
        child.wait(60)
        return steps
    finally:
        if child.poll() is None:
            child.kill()


def run_size(agent, impl, pool, remote_addr, size, count, nbytes):
    n = min(count, POOL // size)
    offsets = np.arange(n, dtype=np.uint64) * size
    local_rows = np.stack([pool.ctypes.data + offsets, np.full(n, size, np.uint64), np.zeros(n, np.uint64)], 1)
    remote_rows = local_rows.copy()
    remote_rows[:, 0] = remote_addr + offsets
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(local_rows.astype(np.int64), "DRAM"))
    remote = agent.prep_xfer_dlist("target", agent.get_xfer_descs(remote_rows.astype(np.int64), "DRAM"))
    ids = np.arange(n)
    if impl == "direct":  # the same READ through the agent's engine, posted and polled alike
        low = agent.agent  # (the low-level nixlAgent: its engine, and the target agent's address)
        engine, peer = low._engine, low._agents.address("target")

        def one():
            r = engine.read_async(peer, local=local_rows[:, 0], remote=remote_rows[:, 0], length=size)
            while not r.done():
                pass
            r.wait()
    else:
        def one():
            h = agent.make_prepped_xfer("READ", local, ids, remote, ids)
            if agent.transfer(h) != "DONE":
                while agent.check_xfer_state(h) != "DONE":
                    pass
            agent.release_xfer_handle(h)
    reps = max(2, nbytes // (n * size))
    pool[:] = 0
    for _ in range(2):
        one()
    t0 = time.perf_counter()
    for _ in range(reps):
        one()
    seconds = time.perf_counter() - t0
    span = n * size
    equal = bool(np.array_equal(pool[:span], pattern()[:span]))
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    return {"size": size, "blocks": n, "gbps": round(span * reps / seconds / 1e9, 3), "data_equal": equal}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["xfer", "nixl", "direct"], required=True)
    p.add_argument("--role", choices=["initiator", "target"], default="initiator")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--sizes", default="4096,16384,65536,1048576")
    p.add_argument("--count", type=int, default=1000, help="blocks per request (at most)")
    p.add_argument("--bytes", type=int, default=256 << 20, help="moved per size")
    a = p.parse_args()
    if a.role == "target":
        target(a.impl, a.port)
        return
    steps = initiator(a.impl, [int(s) for s in a.sizes.split(",")], a.count, a.bytes)
    print(json.dumps({"impl": a.impl, "steps": steps}))


if __name__ == "__main__":
    main()
