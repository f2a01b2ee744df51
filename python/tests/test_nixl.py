"""xfer.nixl: NIXL's Python agent API on xfer, in NIXL's flows (two processes with the metadata
listener; vLLM's prepped descriptors with many requests in flight), with NIXL's argument forms,
return values and exceptions."""

import os
import pickle
import sys
import threading
import time

import numpy as np
import pytest

import xfer.nixl as nixl
from xfer.nixl import nixl_agent, nixl_agent_config

from conftest import HERE, Child

BLOCK = 16 << 10


@pytest.fixture(autouse=True)
def loopback(monkeypatch):
    monkeypatch.setenv("XFER_NIXL_HOST", "127.0.0.1")  # (tests talk to loopback only)


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_two_processes_exchange_metadata_through_the_listener_and_read(host):
    """host: where the agents listen. The initiator reaches the target's listener at
    127.0.0.1 as NIXL code does; an address of this host names its agent on that port, so
    agents that listen on 127.0.0.2 are reached all the same."""
    pytest.importorskip("torch")
    env = {"XFER_NIXL_HOST": host}
    target = Child([sys.executable, os.path.join(HERE, "nixl_peer.py"), "target"], env)
    try:
        port = target.recv()["port"]
        initiator = Child([sys.executable, os.path.join(HERE, "nixl_peer.py"), "initiator",
                           "--port", str(port)], env)
        try:
            assert initiator.recv() == {"ok": True}
        finally:
            initiator.close()
        assert target.recv() == {"ok": True}
    finally:
        target.close()


def pair(telemetry=True):
    """A prefill-side agent P holding 256 KV blocks (numbered bytes), a decode-side D with room
    for them, each knowing the other through get_agent_metadata / add_remote_agent."""
    p = nixl_agent("P", nixl_agent_config(backends=["UCX"]))
    d = nixl_agent("D", nixl_agent_config(num_threads=4, capture_telemetry=telemetry))
    kv = np.repeat(np.arange(256, dtype=np.uint8), BLOCK)
    room = np.zeros_like(kv)
    p.register_memory(p.get_reg_descs([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM"))
    d.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")
    name = d.add_remote_agent(p.get_agent_metadata())
    assert name == b"P"  # (NIXL returns bytes; every name argument takes str or bytes)
    p.add_remote_agent(d.get_agent_metadata())
    return p, d, kv, room


def blocks(arr):
    return [(arr.ctypes.data + k * BLOCK, BLOCK, 0) for k in range(len(arr) // BLOCK)]


def test_prepped_lists_many_requests_in_flight_each_notifies_the_owner():
    p, d, kv, room = pair()
    local = d.prep_xfer_dlist("NIXL_INIT_AGENT", d.get_xfer_descs(blocks(room), "DRAM"))
    remote = d.prep_xfer_dlist(b"P", d.get_xfer_descs(np.array(blocks(kv), np.int64), "DRAM"))
    rng = np.random.default_rng(7)
    handles = []
    for req in range(32):  # request req: 8 blocks, from random places into its own
        src = rng.choice(256, 8, replace=False)
        dst = np.arange(req * 8, req * 8 + 8)
        h = d.make_prepped_xfer("READ", local, dst, remote, src, notif_msg=f"req{req}:1".encode())
        assert d.transfer(h) in ("DONE", "PROC")
        handles.append((h, src, dst))
    for h, src, dst in handles:
        wait_for(lambda: d.check_xfer_state(h) == "DONE")
        got = room.reshape(256, BLOCK)[dst, 0]
        assert (got == src).all()
        t = d.get_xfer_telemetry(h)
        assert (t.totalBytes, t.descCount) == (8 * BLOCK, 8) and t.xferDuration >= t.postDuration >= 0
        d.release_xfer_handle(h)
    seen = []
    wait_for(lambda: seen.extend(p.get_new_notifs().get("D", [])) or len(seen) == 32)
    assert sorted(seen) == sorted(f"req{r}:1".encode() for r in range(32))
    # Loopback: an agent may name itself as the remote side.
    room[:BLOCK] = 0
    itself = d.prep_xfer_dlist("D", d.get_xfer_descs(blocks(room)[1:2], "DRAM"))
    h = d.make_prepped_xfer("READ", local, [0], itself, [0])
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    assert (room[:BLOCK] == room[BLOCK]).all()
    for handle in (local, remote, itself):
        d.release_dlist_handle(handle)
    with pytest.raises(nixl.nixlInvalidParamError):
        d.make_prepped_xfer("READ", local, [0], remote, [0])
    d.release_xfer_handle(h)
    with pytest.raises(nixl.nixlInvalidParamError):
        d.transfer(h)


def test_a_prepped_handle_posted_again_moves_the_data_of_the_moment():
    """make_prepped_xfer's handles run over the engine's prepared lists (posted again, they
    reuse their plan); once the remote agent is gone they fall back to the plain path."""
    p, d, kv, room = pair()
    local = d.prep_xfer_dlist("", d.get_xfer_descs(blocks(room), "DRAM"))
    remote = d.prep_xfer_dlist("P", d.get_xfer_descs(blocks(kv), "DRAM"))
    h = d.make_prepped_xfer("READ", local, np.arange(8), remote, np.arange(8, 16))
    xfer = d.agent._xfer(h._handle)  # (the low-level agent's transfer behind the handle)
    assert xfer.prepared is not None, "the handle does not use the engine's prepared lists"
    for value in (3, 4, 5):
        kv[8 * BLOCK:16 * BLOCK] = value
        d.transfer(h)
        wait_for(lambda: d.check_xfer_state(h) == "DONE")
        assert (room[:8 * BLOCK] == value).all()
    p.close()
    deadline = time.monotonic() + 30
    while xfer.prepared is not None:  # (until D has seen P leave: a posting fails, or completes)
        assert time.monotonic() < deadline, "a list of a dead session is still used"
        try:
            d.transfer(h)
            wait_for(lambda: d.check_xfer_state(h) == "DONE")
        except nixl.nixlRemoteDisconnectError:
            pass
    with pytest.raises(nixl.nixlRemoteDisconnectError):  # the plain path says why
        d.transfer(h)
        wait_for(lambda: d.check_xfer_state(h) == "DONE")


def test_writes_standalone_notifications_and_tag_matching():
    p, d, kv, room = pair()
    room[:] = 9
    h = d.initialize_xfer("WRITE", d.get_xfer_descs(blocks(room)[:4], "DRAM"),
                          d.get_xfer_descs(blocks(kv)[:4], "DRAM"), "P", "done:1")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    assert (kv[:4 * BLOCK] == 9).all()
    d.send_notif("P", b"other")
    wait_for(lambda: p.check_remote_xfer_done("D", b"done"))          # a prefix
    wait_for(lambda: p.check_remote_xfer_done(b"D", b"the", tag_is_prefix=False))  # "other" has it
    assert not p.check_remote_xfer_done("D", b"done")                  # each is taken once
    h2 = d.initialize_xfer("WRITE", d.get_xfer_descs(np.zeros((0, 3), np.int64), "DRAM"),
                           d.get_xfer_descs(np.zeros((0, 3), np.int64), "DRAM"), "P", b"empty")
    assert d.transfer(h2) == "DONE"  # no descriptors: done at once, its notification still goes
    wait_for(lambda: p.check_remote_xfer_done("D", b"empty"))


def test_descriptor_forms_are_read_as_nixl_reads_them():
    torch = pytest.importorskip("torch")
    a = nixl_agent("forms")
    t = torch.arange(64, dtype=torch.float32)
    one = a.get_xfer_descs(t)
    assert one.getType() == nixl.DRAM_SEG and one[0] == (t.data_ptr(), 256, 0)
    two = a.get_reg_descs([t[:32], t[32:]])
    assert two.descCount() == 2 and two[1] == (t.data_ptr() + 128, 128, 0, b"")
    assert a.get_xfer_descs(t[::2]) is None  # not contiguous
    arr = np.array([[0x1000, 64, 0], [0x2000, 64, 0]])
    assert a.get_xfer_descs(arr, "DRAM") == a.get_xfer_descs([(0x1000, 64, 0), (0x2000, 64, 0)], "DRAM")
    with pytest.raises(KeyError):  # (an unknown memory type, as NIXL)
        a.get_xfer_descs(arr, "SSD")
    assert a.get_xfer_descs([(1, 2)], "DRAM") is None and a.get_xfer_descs(arr) is None
    reg = a.get_reg_descs([(0x1000, 64, 0, "meta")], "DRAM", is_sorted=True)
    assert reg.trim() == a.get_xfer_descs([(0x1000, 64, 0)], "DRAM")
    assert pickle.loads(a.get_serialized_descs(reg)) == reg == a.deserialize_descs(pickle.dumps(reg))
    registered = a.register_memory(t)
    assert registered[0][:3] == (t.data_ptr(), 256, 0)
    a.deregister_memory(registered)


def test_errors_raise_nixls_exceptions():
    p, d, kv, room = pair(telemetry=False)
    local, remote = d.get_xfer_descs(blocks(room)[:2], "DRAM"), d.get_xfer_descs(blocks(kv)[:2], "DRAM")
    with pytest.raises(KeyError):
        d.initialize_xfer("COPY", local, remote, "P")
    with pytest.raises(nixl.nixlInvalidParamError):  # lengths differ
        d.initialize_xfer("READ", local, d.get_xfer_descs([(kv.ctypes.data, 1, 0)] * 2, "DRAM"), "P")
    with pytest.raises(nixl.nixlNotFoundError, match="NIXL_ERR_NOT_FOUND"):
        d.initialize_xfer("READ", local, remote, "nobody")
    h = d.initialize_xfer("READ", local, remote, "P")
    with pytest.raises(nixl.nixlNotPostedError):
        d.check_xfer_state(h)
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    with pytest.raises(nixl.nixlNoTelemetryError):
        d.get_xfer_telemetry(h)
    outside = d.get_xfer_descs([(kv.ctypes.data + kv.nbytes, BLOCK, 0)], "DRAM")
    bad = d.initialize_xfer("READ", d.get_xfer_descs(blocks(room)[:1], "DRAM"), outside, "P")
    with pytest.raises(nixl.nixlNotAllowedError):
        d.transfer(bad)
    with pytest.raises(nixl.nixlInvalidParamError):
        d.add_remote_agent(b"not metadata")
    with pytest.raises(nixl.nixlInvalidParamError):
        d.register_memory([(1, 2)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        d.deregister_memory(d.get_reg_descs([(0x1000, 64, 0, "")], "DRAM"))
    with pytest.raises(nixl.nixlNotFoundError):
        d.create_backend("GDS")
    assert not d.check_remote_metadata("nobody")
    d.remove_remote_agent("nobody")  # (never raises, as in NIXL)


def test_connection_partial_metadata_memory_queries_and_cost_estimates():
    p, d, kv, room = pair()
    assert d.make_connection("P") is None and d.make_connection(b"P", ["UCX"]) is None
    with pytest.raises(nixl.nixlNotFoundError):
        d.make_connection("nobody")
    # check_remote_metadata with descriptors: True only for memory the agent registered.
    inside = d.get_xfer_descs(blocks(kv)[3:5], "DRAM")
    assert d.check_remote_metadata("P", inside) and d.check_remote_metadata("P")
    later = np.ones(BLOCK, np.uint8)
    later_descs = d.get_xfer_descs([(later.ctypes.data, BLOCK, 0)], "DRAM")
    assert not d.check_remote_metadata("P", later_descs)
    p.register_memory([(later.ctypes.data, BLOCK, 0, "")], "DRAM")
    wait_for(lambda: d.check_remote_metadata("P", later_descs))
    # Partial metadata gives only its descriptors (test_nixl_bindings.py has more).
    q = nixl_agent("Q")
    inside_reg = p.get_reg_descs([(kv.ctypes.data + 3 * BLOCK, 2 * BLOCK, 0, "")], "DRAM")
    assert q.add_remote_agent(p.get_partial_agent_metadata(inside_reg, True, ["UCX"])) == b"P"
    assert q.check_remote_metadata("P", inside) and not q.check_remote_metadata("P", later_descs)
    # Memory backends do not answer query_memory (NIXL's UCX neither); unknown backends: ValueError.
    with pytest.raises(nixl.nixlNotSupportedError):
        d.query_memory([(room.ctypes.data, BLOCK, 0, "")], "UCX", "DRAM")
    with pytest.raises(ValueError, match="Backend 'GDS' not found"):
        d.query_memory([(room.ctypes.data, BLOCK, 0, "")], "GDS", "DRAM")
    # The cost estimate: nothing observed yet, then the rate of the last transfer to that agent.
    h = d.initialize_xfer("READ", d.get_xfer_descs(blocks(room)[:64], "DRAM"),
                          d.get_xfer_descs(blocks(kv)[:64], "DRAM"), "P")
    assert d.estimate_xfer_cost(h) == (0, 0, "UNKNOWN")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    t = d.get_xfer_telemetry(h)
    duration, margin, method = d.estimate_xfer_cost(h)
    assert (margin, method) == (0, "UNKNOWN") and abs(duration - t.xferDuration) <= 1


def test_a_peer_that_goes_away_then_comes_back():
    p, d, kv, room = pair()
    local, remote = d.get_xfer_descs(blocks(room)[:1], "DRAM"), d.get_xfer_descs(blocks(kv)[:1], "DRAM")
    p.close()  # (its process died: its engine is gone)
    with pytest.raises(nixl.nixlRemoteDisconnectError, match="NIXL_ERR_REMOTE_DISCONNECT"):
        h = d.initialize_xfer("READ", local, remote, "P")
        d.transfer(h)
        wait_for(lambda: d.check_xfer_state(h) == "DONE")
    again = nixl_agent("P")
    kv2 = np.full(BLOCK, 5, np.uint8)
    again.register_memory([(kv2.ctypes.data, kv2.nbytes, 0, "")], "DRAM")
    d.remove_remote_agent("P")
    assert d.add_remote_agent(again.get_agent_metadata()) == b"P"
    h = d.initialize_xfer("READ", local, d.get_xfer_descs([(kv2.ctypes.data, BLOCK, 0)], "DRAM"), "P")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    assert (room[:BLOCK] == 5).all()


def test_install_makes_nixls_own_imports_load_xfer_nixl():
    saved = {k: sys.modules.get(k) for k in ("nixl", "nixl._api", "nixl._bindings", "nixl._utils",
                                              "nixl.logging")}
    try:
        nixl.install()
        # What vLLM's connector and SGLang's backend import.
        from nixl._api import nixl_agent as agent_type, nixl_agent_config, nixl_thread_sync_t  # noqa: F401
        from nixl._bindings import (nixlBackendError, nixlCancelledError, nixlNotFoundError,  # noqa: F401
                                    nixlRemoteDisconnectError, nixlXferDList, nixlXferTelemetry)
        assert agent_type is nixl_agent and nixlXferDList is nixl.nixlXferDList
        assert issubclass(nixlRemoteDisconnectError, Exception)
        assert "np" not in dir(sys.modules["nixl"])  # (only NIXL's names)
        # What NIXL's own tests and examples import.
        import nixl._bindings as bindings
        import nixl._utils as utils
        from nixl.logging import get_logger
        assert bindings.nixlAgent is nixl.nixlAgent and utils.malloc_passthru is nixl.malloc_passthru
        from nixl._api import nixlBind  # (LMCache's NIXL backend takes the bindings from _api)
        assert nixlBind is bindings
        assert get_logger("_x").name == "nixl.x"
        import nixl as top
        assert top.nixl_thread_sync_t is nixl_thread_sync_t  # (_api's, as NIXL's package has it)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_configs_of_vllm_and_sglang():
    # vLLM: backends other than UCX are skipped with a log line, as NIXL does without them.
    a = nixl_agent("vllm", nixl_agent_config(backends=["UCX", "GDS_MT"], capture_telemetry=True))
    assert list(a.backends) == ["UCX"]
    # SGLang: no backend in the config, then create_backend by name after get_plugin_list.
    b = nixl_agent("sglang", nixl_agent_config(backends=[], num_threads=8,
                                               sync_mode=nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
    assert b.backends == {} and "UCX" in b.get_plugin_list()
    b.create_backend("UCX", {"num_threads": "8"})
    assert list(b.backends) == ["UCX"] and b.name == "sglang"
    empty = b.get_xfer_descs(np.zeros((0, 3), np.int64), "VRAM")
    assert empty is not None and not len(empty) and bool(empty)  # (an empty list is truthy, as NIXL's)


def test_large_lists_long_notifications_and_bad_values():
    p, d, kv, room = pair()
    many = [(0x10000 + 64 * k, 64, 0) for k in range(200000)]
    t0 = time.monotonic()
    big = d.get_xfer_descs(many, "DRAM")
    assert big.descCount() == 200000 and time.monotonic() - t0 < 5.0, "a list is built in linear time"
    table = d.get_serialized_descs(d.get_xfer_descs(many[:2000], "DRAM"))
    assert len(table) > 4096
    d.send_notif("P", table)  # (a block table in a notification, as NIXL's examples send one)
    got = []
    wait_for(lambda: got.extend(p.get_new_notifs().get("D", [])) or got)
    assert p.deserialize_descs(got[0]) == d.get_xfer_descs(many[:2000], "DRAM")
    # The longest notification: 1 MiB less the drop-in's frame (13 bytes and the agent's name).
    longest = (1 << 20) - 13 - len("D")
    d.send_notif("P", b"n" * longest)
    got = []
    wait_for(lambda: got.extend(p.get_new_notifs().get("D", [])) or got)
    assert got == [b"n" * longest]
    with pytest.raises(nixl.nixlInvalidParamError, match=f"at most {longest} here"):
        d.send_notif("P", b"n" * (longest + 1))
    assert d.get_xfer_descs([(-1, 64, 0)], "DRAM") is None
    assert d.get_xfer_descs(np.array([[0x1000, -64, 0]]), "DRAM") is None
    local = d.prep_xfer_dlist("", d.get_xfer_descs(blocks(room)[:2], "DRAM"))
    remote = d.prep_xfer_dlist("P", d.get_xfer_descs(blocks(kv)[:2], "DRAM"))
    for bad in ([2], [-1], [[0]]):
        with pytest.raises(nixl.nixlInvalidParamError):
            d.make_prepped_xfer("READ", local, bad, remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError):  # a remote list as the local side
        d.make_prepped_xfer("READ", remote, [0], remote, [0])


def test_releasing_a_running_transfer_waits_until_it_stopped():
    p, d, kv, room = pair()
    local = d.prep_xfer_dlist("", d.get_xfer_descs(blocks(room), "DRAM"))
    remote = d.prep_xfer_dlist("P", d.get_xfer_descs(blocks(kv), "DRAM"))
    for _ in range(5):
        h = d.make_prepped_xfer("READ", local, np.arange(256), remote, np.arange(256))
        d.transfer(h)
        xfer = d.agent._xfer(h._handle)
        d.release_xfer_handle(h)  # (at once: it may still be running)
        assert xfer.request.done(), "released while its bytes may still move"
        with pytest.raises(nixl.nixlInvalidParamError):
            d.check_xfer_state(h)


def test_a_failed_posting_stays_the_transfers_status_until_it_is_posted_again():
    """As NIXL keeps a request's error status: check_xfer_state raises the posting's error (not
    "DONE" of the posting before, nor nixlNotPostedError), on the prepared and the plain path."""
    p, d, kv, room = pair()
    local = d.prep_xfer_dlist("", d.get_xfer_descs(blocks(room)[:1], "DRAM"))
    remote = d.prep_xfer_dlist("P", d.get_xfer_descs(blocks(kv)[:1], "DRAM"))
    prepared = d.make_prepped_xfer("READ", local, [0], remote, [0])
    plain = d.initialize_xfer("READ", d.get_xfer_descs(blocks(room)[:1], "DRAM"),
                              d.get_xfer_descs(blocks(kv)[:1], "DRAM"), "P")
    too_long = b"x" * (2 << 20)  # (a notification over 1 MiB: the posting fails)
    for h in (prepared, plain):
        d.transfer(h)
        wait_for(lambda: d.check_xfer_state(h) == "DONE")
        with pytest.raises(nixl.nixlInvalidParamError) as failed:
            d.transfer(h, too_long)
        for _ in range(2):
            with pytest.raises(nixl.nixlInvalidParamError, match=str(failed.value)[:30]):
                d.check_xfer_state(h)
        d.transfer(h)
        wait_for(lambda: d.check_xfer_state(h) == "DONE")


def test_threads_taking_their_own_notifications_lose_none():
    """check_remote_xfer_done reads and takes under the agent's lock: each message goes to the
    one caller that asked for it, whatever the threads."""
    p, d, kv, room = pair()
    threads, each = 4, 500
    for i in range(threads * each):
        d.send_notif("P", f"t{i % threads}:{i};".encode())
    wait_for(lambda: len(p.update_notifs().get("D", [])) == threads * each)
    found = [0] * threads

    def take(k):
        for i in range(k, threads * each, threads):
            found[k] += p.check_remote_xfer_done("D", f"t{k}:{i};".encode())

    workers = [threading.Thread(target=take, args=(k,)) for k in range(threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch between any two steps)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert found == [each] * threads and p.notifs["D"] == []


def read_one_block(d, room, kv):
    """A handle of D's that read a block of P's."""
    h = d.initialize_xfer("READ", d.get_xfer_descs(blocks(room)[:1], "DRAM"),
                          d.get_xfer_descs(blocks(kv)[:1], "DRAM"), "P")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    return h


class Stubborn:
    """A transfer's request that goes on when canceled, until stop is set."""

    def __init__(self):
        self.stop = threading.Event()

    def done(self):
        return self.stop.is_set()

    def cancel(self):
        pass

    def wait(self, timeout=None):
        return self.stop.wait(timeout)


def test_a_handle_collected_while_running_does_not_wait_and_close_waits_for_it():
    """As NIXL defers a collected handle whose release failed to the agent's end: its transfer is
    canceled, kept (never posted again) and waited for by close()."""
    p, d, kv, room = pair()
    h = read_one_block(d, room, kv)
    xfer = d.agent._xfer(h._handle)
    xfer.request = stubborn = Stubborn()  # (a transfer that will not stop yet)
    t0 = time.monotonic()
    del h  # (collected)
    assert time.monotonic() - t0 < 1.0, "the collection waited for the transfer"
    assert xfer.released and d.agent._leaked == [xfer] and xfer not in d.agent._xfers.values()
    threading.Timer(0.3, stubborn.stop.set).start()
    d.close()
    assert stubborn.done(), "close() did not wait for the transfer to stop"


def test_a_closed_agent_raises_nixls_error_saying_so():
    p, d, kv, room = pair()
    h = d.initialize_xfer("READ", d.get_xfer_descs(blocks(room)[:1], "DRAM"),
                          d.get_xfer_descs(blocks(kv)[:1], "DRAM"), "P")
    d.close()
    calls = (d.get_new_notifs, d.update_notifs, lambda: d.send_notif("P", b"x"), lambda: d.transfer(h),
             d.get_agent_metadata, lambda: d.check_remote_metadata("P"), d.get_listen_port,
             lambda: d.register_memory([(room.ctypes.data, BLOCK, 0, "")], "DRAM"))
    for call in calls:
        with pytest.raises(nixl.nixlBackendError, match="agent 'D' is closed"):
            call()
    d.close()  # (again: nothing)


def test_a_transfer_that_did_not_complete_reaches_its_target_as_a_failure(monkeypatch):
    """xfer's addition (XFER_NIXL_NOTIFY_OUTCOMES=1): NIXL code reading get_new_notifs sees
    nothing of it (as with NIXL); the target finds it with check_remote_xfer_state ("ERR") or
    get_failed_notifs."""
    monkeypatch.setenv("XFER_NIXL_NOTIFY_OUTCOMES", "1")
    p, d, kv, room = pair()
    local = d.prep_xfer_dlist("", d.get_xfer_descs(blocks(room), "DRAM"))
    remote = d.prep_xfer_dlist("P", d.get_xfer_descs(blocks(kv), "DRAM"))
    many = np.tile(np.arange(256), 1000)  # 4 GB of 16 KiB blocks: still running when released
    for k in (1, 2):
        h = d.make_prepped_xfer("WRITE", local, many, remote, many, notif_msg=f"fail:{k}".encode())
        d.transfer(h)
        d.release_xfer_handle(h)  # cancels it
    h = d.make_prepped_xfer("WRITE", local, [0], remote, [0], notif_msg=b"done:3")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    wait_for(lambda: p.check_remote_xfer_state("D", b"fail") == "ERR")  # fail:1
    wait_for(lambda: p.check_remote_xfer_state("D", b"done") == "DONE")
    assert p.check_remote_xfer_state("D", b"done") == "PROC"  # (taken)
    failed = p.get_failed_notifs()
    assert list(failed) == ["D"] and len(failed["D"]) == 1
    f = failed["D"][0]
    assert f.message == b"fail:2" and f.outcome == "CANCELED" and len(f.landed) < len(many)
    assert p.get_new_notifs() == {} and p.get_failed_notifs() == {}
    assert not p.check_remote_xfer_done("D", b"fail")
    # One more that fails, taken by check_remote_xfer_state: no agent is left listed with none.
    h = d.make_prepped_xfer("WRITE", local, many, remote, many, notif_msg=b"fail:4")
    d.transfer(h)
    d.release_xfer_handle(h)
    wait_for(lambda: p.check_remote_xfer_state("D", b"fail") == "ERR")
    assert p.get_failed_notifs() == {}


def test_metadata_through_etcd_as_nixl_reads_it_from_its_environment(etcd, monkeypatch):
    """NIXL's etcd flow: NIXL_ETCD_ENDPOINTS set, send_local_metadata() and
    fetch_remote_metadata(name) without an address, then check_remote_metadata until it came."""
    endpoint = etcd[len("etcd://"):].split("/")[0]
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://{endpoint}")
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", "/nixl/pytest")
    target = nixl_agent("target", nixl_agent_config(True, True, 0))
    kv = np.full(4 * BLOCK, 7, np.uint8)
    target.register_memory([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM")
    target.send_local_metadata()
    initiator = nixl_agent("initiator")
    initiator.fetch_remote_metadata("target")
    initiator.fetch_remote_metadata("late")           # (not there yet: looked up until it is)
    wait_for(lambda: initiator.check_remote_metadata("target"))
    assert not initiator.check_remote_metadata("late")
    room = np.zeros_like(kv)
    initiator.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")
    h = initiator.initialize_xfer("READ", initiator.get_xfer_descs(blocks(room), "DRAM"),
                                  initiator.get_xfer_descs(blocks(kv), "DRAM"), "target", b"UUID")
    initiator.transfer(h)
    wait_for(lambda: initiator.check_xfer_state(h) == "DONE")
    assert (room == 7).all()
    wait_for(lambda: target.check_remote_xfer_done("initiator", b"UUID"))
    late = nixl_agent("late")
    wait_for(lambda: initiator.check_remote_metadata("late"))
    late.close()
    with pytest.raises(nixl.nixlNotSupportedError):  # (no address and no etcd: as before)
        monkeypatch.delenv("NIXL_ETCD_ENDPOINTS")
        nixl_agent("plain").fetch_remote_metadata("target")
