"""A peer that keeps its session alive but stalls our batches (its UCX progress thread stopped
with ptrace; its control thread goes on): a deregistration fences our ucx batches to it and
returns within the heartbeat timeout (2 s), and the stalled WRITE fails with CONNECTION_LOST
(before: both waited for the request's deadline, 28 s here)."""

import ctypes
import os
import time

import numpy as np
import pytest

import xfer

from conftest import Peer

PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH = 0x4206, 0x4207, 17


def threads_named(pid, name):
    tasks = f"/proc/{pid}/task"
    return [int(t) for t in os.listdir(tasks) if open(f"{tasks}/{t}/comm").read().strip() == name]


def test_a_deregistration_interrupts_ucx_batches_a_peer_stalls(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")  # (puts that need the peer's progress; the peer inherits it)
    try:
        xfer.Engine("127.0.0.1", transport="ucx").close()
    except xfer.UnsupportedError as e:
        pytest.skip(f"no ucx here: {e}")
    libc = ctypes.CDLL(None, use_errno=True)
    peer = Peer(nbytes=64 << 20, options={"transport": "ucx", "heartbeat_timeout": 2.0})
    stopped = []
    try:
        progress = threads_named(peer.proc.pid, "xfer-ucx-prog")
        assert progress, "the peer has no ucx progress thread"
        with xfer.Engine("127.0.0.1", transport="ucx", heartbeat_timeout=2.0) as engine:
            engine.connect(peer.name)
            src = np.ones(64 << 20, np.uint8)
            engine.register(src)
            engine.write(peer.name, [(src.ctypes.data, peer.addr, 1 << 20)])  # (the endpoint is up)
            for tid in progress:
                if libc.ptrace(PTRACE_SEIZE, tid, 0, 0) != 0:
                    pytest.skip(f"cannot ptrace the peer's thread: {os.strerror(ctypes.get_errno())}")
                stopped.append(tid)
                assert libc.ptrace(PTRACE_INTERRUPT, tid, 0, 0) == 0
            time.sleep(0.2)
            request = engine.write_async(peer.name, [(src.ctypes.data, peer.addr, src.nbytes)], timeout=30)
            time.sleep(1.0)
            assert not request.done(), "the WRITE did not stall"
            assert engine.peer_info(peer.name).name == peer.name  # (its session is alive)
            other = engine.register(np.zeros(4096, np.uint8))
            t0 = time.monotonic()
            engine.deregister(other)
            assert time.monotonic() - t0 < 4.0, "the deregistration waited for the stalled batches"
            with pytest.raises(xfer.ConnectionLostError, match="interrupted"):
                request.wait(10)
    finally:
        for tid in stopped:
            libc.ptrace(PTRACE_DETACH, tid, 0, 0)
        peer.kill()  # (UCX 1.13 may abort in it when it answers puts on a closed endpoint)
