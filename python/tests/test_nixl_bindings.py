"""xfer.nixl's NIXL layers below nixl_agent, and NIXL's behaviours that code can observe: the
low-level agent (nixl._bindings.nixlAgent) nixl_agent is built on, the enums and constants,
nixl._utils and nixl.logging, NIXL's telemetry environment and its per-agent event file, the
listener's port line, partial metadata and its refusal, the POSIX query, and NIXL's errors."""

import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import xfer
from xfer.nixl import _api, _bindings as nb, _utils, _wire, nixl_agent, nixl_agent_config

BLOCK = 4096
TELEMETRY_VARS = ("NIXL_TELEMETRY_ENABLE", "NIXL_TELEMETRY_DIR", "NIXL_TELEMETRY_EXPORTER",
                  "NIXL_TELEMETRY_BUFFER_SIZE", "NIXL_TELEMETRY_ENABLED_METRICS")


@pytest.fixture(autouse=True)
def loopback(monkeypatch):
    monkeypatch.setenv("XFER_NIXL_HOST", "127.0.0.1")  # (tests talk to loopback only)
    for var in TELEMETRY_VARS + ("NIXL_ETCD_ENDPOINTS",):
        monkeypatch.delenv(var, raising=False)


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def run_python(code, **env):
    """Runs code in a new interpreter (logging is set up once per process); (stdout, stderr)."""
    full = dict(os.environ, XFER_NIXL_HOST="127.0.0.1", **env)
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


# ---------------------------------------------------------------- enums and constants
def test_enums_and_constants_read_as_nixls():
    assert str(nb.DRAM_SEG) == "nixl_mem_t.DRAM_SEG" and nb.FILE_SEG == 4 and nb.NIXL_WRITE == 1
    assert nb.NIXL_SUCCESS == 0 and nb.NIXL_IN_PROG == 1 and nb.NIXL_ERR_NOT_FOUND == -4
    assert str(nb.NIXL_SUCCESS) == "nixl_status_t.NIXL_SUCCESS"
    # Three sync modes; DEFAULT is NONE, in the bindings and in _api's Enum over them.
    assert nb.NIXL_THREAD_SYNC_DEFAULT is nb.NIXL_THREAD_SYNC_NONE and len(nb.nixl_thread_sync_t) == 3
    modes = [nb.NIXL_THREAD_SYNC_NONE, nb.NIXL_THREAD_SYNC_STRICT, nb.NIXL_THREAD_SYNC_RW]
    assert [m.value for m in _api.nixl_thread_sync_t] == modes
    assert str(_api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW) == "nixl_thread_sync_t.NIXL_THREAD_SYNC_RW"
    assert nb.HAVE_UCX_GPU_DEVICE_API is False and nb.NIXL_INIT_AGENT == "" and nb.DEFAULT_COMM_PORT == 8888
    # Each error status has its exception, whose text starts with the status name.
    assert str(nb.nixlNotFoundError("why")) == "NIXL_ERR_NOT_FOUND: why"
    assert str(nb.nixlCancelledError()) == "NIXL_ERR_CANCELED"
    remote = nb.nixlRemoteDList(nb.VRAM_SEG, [(0x1000, 64, 1, "peer")])
    assert remote[0] == (0x1000, 64, 1, "peer") and remote.getType() == nb.VRAM_SEG
    with pytest.raises(TypeError):
        nb.nixlXferDList(nb.DRAM_SEG, [[1, 2, 3]])  # (tuples only, as NIXL)
    with pytest.raises(ValueError):
        nb.nixlXferDList(nb.DRAM_SEG, [(1, 2, 3, 4)])


def test_agent_config_arguments_are_checked_as_nixl_checks_them():
    with pytest.raises(ValueError, match="non-empty name"):
        nixl_agent("")
    with pytest.raises(TypeError, match="sync_mode must be a nixl_thread_sync_t"):
        nixl_agent_config(sync_mode=1)
    with pytest.raises(TypeError, match="sync_mode must be a nixl_thread_sync_t"):
        nixl_agent_config(sync_mode=nb.NIXL_THREAD_SYNC_RW)  # (the bindings' value: not _api's Enum)
    with pytest.raises(TypeError):
        nixl_agent_config(no_such_option=1)
    config = nb.nixlAgentConfig()
    config.syncMode = 1
    with pytest.raises(TypeError, match="syncMode"):
        nb.nixlAgent("low", config)
    with pytest.raises(TypeError, match="nixlAgentConfig"):
        nb.nixlAgent("low", 5)
    # NIXL's positional order; num_workers (5th) is taken and not kept, as NIXL's.
    config = nb.nixlAgentConfig(True, True, 0, nb.NIXL_THREAD_SYNC_RW, 4, 7)
    assert (config.listenPort, config.syncMode, config.pthrDelay) == (0, nb.NIXL_THREAD_SYNC_RW, 7)
    assert not hasattr(config, "num_workers")
    a = nixl_agent("ops", nixl_agent_config(backends=[]))
    x = nb.nixlXferDList(nb.DRAM_SEG)
    with pytest.raises(KeyError):  # (the operation is read first)
        a.make_prepped_xfer("RD", 0, [], 0, [])
    with pytest.raises(KeyError):
        a.initialize_xfer("WR", x, x, "nobody")
    with pytest.raises(KeyError):  # an unknown memory type
        a.get_xfer_descs([(1, 2, 3)], "V-RAM")
    assert a.get_xfer_descs([(1, 2, 3, 4)], "DRAM") is None and a.get_reg_descs([(1, 2, 3)], "DRAM") is None
    assert a.get_xfer_descs(nb.nixlRegDList(nb.DRAM_SEG)) is None and a.get_reg_descs(x) is None
    assert a.get_xfer_descs([(1, 2, 3)]) is None  # (no mem_type)


def test_nixl_agent_is_built_on_the_low_level_agent(monkeypatch):
    made = []
    real = nb.nixlAgent

    def spy(name, config):
        made.append((name, config.syncMode, config.useListenThread, config.listenPort))
        return real(name, config)

    monkeypatch.setattr(nb, "nixlAgent", spy)
    a = nixl_agent("spied", nixl_agent_config(enable_listen_thread=True, listen_port=0))
    nixl_agent("spied2", nixl_agent_config(sync_mode=_api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW))
    assert made == [("spied", nb.NIXL_THREAD_SYNC_STRICT, True, 0),
                    ("spied2", nb.NIXL_THREAD_SYNC_RW, False, 8888)]
    assert isinstance(a.agent, real) and a.get_listen_port() > 0


# ---------------------------------------------------------------- the low-level agent
def test_the_low_level_agent_moves_bytes_with_statuses_and_int_handles(monkeypatch):
    config = nb.nixlAgentConfig()
    config.captureTelemetry = True
    one, two = nb.nixlAgent("One", config), nb.nixlAgent(b"Two", config)
    ucx1, ucx2 = one.createBackend("UCX", {}), two.createBackend("UCX", {})
    assert isinstance(ucx1, int) and ucx1 != 0 and ucx2 != ucx1
    assert one.getBackendParams(ucx1) == ({}, ["DRAM_SEG", "VRAM_SEG"])
    with pytest.raises(nb.nixlInvalidParamError):
        one.createBackend("UCX", {})
    with pytest.raises(nb.nixlNotFoundError):
        one.createBackend("UVX", {})
    src, dst = np.arange(256, dtype=np.uint8), np.zeros(256, np.uint8)
    reg1 = nb.nixlRegDList(nb.DRAM_SEG, [(src.ctypes.data, 256, 0, "dead")])
    reg2 = nb.nixlRegDList(nb.DRAM_SEG, [(dst.ctypes.data, 256, 0, "dead")])
    assert one.registerMem(reg1, [ucx1]) == nb.NIXL_SUCCESS and two.registerMem(reg2) == nb.NIXL_SUCCESS
    assert one.loadRemoteMD(two.getLocalMD()) == b"Two" and two.loadRemoteMD(one.getLocalMD()) == b"One"
    local = nb.nixlXferDList(nb.DRAM_SEG, [(src.ctypes.data + 8, 8, 0)])
    remote = nb.nixlXferDList(nb.DRAM_SEG, [(dst.ctypes.data + 8, 8, 0)])
    with pytest.raises(TypeError):  # (an nixl_xfer_op_t, not NIXL's string)
        one.createXferReq("WRITE", local, remote, "Two")
    handle = one.createXferReq(nb.NIXL_WRITE, local, remote, "Two", "n\0tification")
    assert isinstance(handle, int) and handle != 0
    with pytest.raises(nb.nixlNotPostedError):
        one.getXferStatus(handle)
    status, notifs = one.postXferReq(handle), {}
    deadline = time.monotonic() + 30
    while status != nb.NIXL_SUCCESS or not notifs:
        assert status in (nb.NIXL_SUCCESS, nb.NIXL_IN_PROG) and time.monotonic() < deadline
        status = one.getXferStatus(handle) if status != nb.NIXL_SUCCESS else status
        notifs = two.getNotifs(notifs)
    assert notifs == {"One": [b"n\0tification"]} and (dst[8:16] == src[8:16]).all() and dst[16] == 0
    telemetry = one.getXferTelemetry(handle)
    assert (telemetry.descCount, telemetry.totalBytes) == (1, 8) and telemetry.startTime > 0
    assert telemetry.xferDuration >= telemetry.postDuration > 0
    assert one.queryXferBackend(handle) == ucx1
    assert one.releaseXferReq(handle) == nb.NIXL_SUCCESS
    with pytest.raises(nb.nixlInvalidParamError):  # (released)
        one.getXferStatus(handle)
    assert one.checkRemoteMD("Two", remote) == nb.NIXL_SUCCESS
    assert one.checkRemoteMD("nobody", remote) == nb.NIXL_ERR_NOT_FOUND  # (returned, not raised)
    assert one.invalidateRemoteMD("Two") == nb.NIXL_SUCCESS
    assert one.invalidateRemoteMD("Two") == nb.NIXL_ERR_NOT_FOUND
    assert one.deregisterMem(reg1, [ucx1]) == nb.NIXL_SUCCESS
    with pytest.raises(nb.nixlNotFoundError):
        one.deregisterMem(reg1)
    with pytest.raises(nb.nixlNotSupportedError, match="GPU device API"):
        one.prepMemView(local)


def test_prepared_lists_by_handle_local_remote_and_loopback():
    a = nb.nixlAgent("Lists", nb.nixlAgentConfig())
    buf = np.arange(4 * BLOCK, dtype=np.uint8) % 251
    a.registerMem(nb.nixlRegDList(nb.DRAM_SEG, [(buf.ctypes.data, buf.nbytes, 0, "")]))
    blocks = nb.nixlXferDList(nb.DRAM_SEG, [(buf.ctypes.data + k * BLOCK, BLOCK, 0) for k in range(4)])
    local = a.prepXferDlist(blocks)                 # (the local overload)
    itself = a.prepXferDlist("Lists", blocks, [])   # (loopback: the agent's own name)
    with pytest.raises(nb.nixlNotFoundError):
        a.prepXferDlist("nobody", blocks)
    with pytest.raises(nb.nixlNotFoundError):  # (by keyword too: not taken for a local list)
        a.prepXferDlist(agent_name="nobody", descs=blocks)
    for bad in ((blocks,), {"backends": []}), (("Lists", blocks, [], []), {}), ((), {"backend": []}):
        with pytest.raises(TypeError, match="prepXferDlist"):  # (neither of NIXL's two forms)
            a.prepXferDlist(*bad[0], **bad[1])
    by_keyword = a.prepXferDlist(agent_name="Lists", descs=blocks, backend=[])
    assert a.makeXferReq(nb.NIXL_READ, a.prepXferDlist(descs=blocks), [0], by_keyword, [1])
    with pytest.raises(nb.nixlInvalidParamError):   # (a list of an agent's memory as the local side)
        a.makeXferReq(nb.NIXL_READ, itself, [0], itself, [1])
    h = a.makeXferReq(nb.NIXL_READ, local, np.array([0], np.int32), itself, [3])
    if a.postXferReq(h) != nb.NIXL_SUCCESS:
        wait_for(lambda: a.getXferStatus(h) == nb.NIXL_SUCCESS)
    assert (buf[:BLOCK] == buf[3 * BLOCK:]).all()
    assert a.releasedDlistH(local) == nb.NIXL_SUCCESS
    with pytest.raises(nb.nixlInvalidParamError):
        a.makeXferReq(nb.NIXL_READ, local, [0], itself, [1])


# ---------------------------------------------------------------- nixl._utils and nixl.logging
def test_utils_give_raw_memory_by_address():
    addr = _utils.malloc_passthru(100)
    other = _utils.malloc_passthru(100)
    try:
        assert addr % 4096 == 0
        _utils.ba_buf(addr, 100)
        _utils.ba_buf(other, 100)
        _utils.verify_transfer(addr, other, 100)
        assert (np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * 100).from_address(addr)) == 0xBA).all()
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * 100).from_address(other))[42] = 1
        with pytest.raises(AssertionError, match="offset 42"):
            _utils.verify_transfer(addr, other, 100)
        with pytest.raises(ValueError):
            _utils.ba_buf(addr, -1)
        with pytest.raises(ValueError):
            _utils.malloc_passthru("100")
    finally:
        _utils.free_passthru(addr)
        _utils.free_passthru(other)


def test_logging_prints_nixl_loggers_to_stdout_at_nixl_log_level():
    code = ("from xfer.nixl.logging import get_logger\n"
            "log = get_logger('_example')\n"
            "assert log.name == 'nixl.example'\n"
            "log.info('an info line'); log.error('an error line')\n")
    out, _ = run_python(code)
    assert "NIXL INFO    <string>:4 an info line" in out and "NIXL ERROR" in out
    out, _ = run_python(code, NIXL_LOG_LEVEL="ERROR")
    assert "an info line" not in out and "an error line" in out
    out, _ = run_python(code, NIXL_LOG_LEVEL="LOUD")
    assert "Invalid NIXL_LOG_LEVEL" in out and "an info line" in out


def test_a_listener_on_port_0_says_its_port_on_stderr_at_info():
    code = ("from xfer.nixl import nixl_agent, nixl_agent_config\n"
            "a = nixl_agent('target', nixl_agent_config(True, True, 0))\n"
            "print(a.get_listen_port())\n")
    out, err = run_python(code, NIXL_LOG_LEVEL="INFO")
    said = [line.split()[-1] for line in err.splitlines() if "MD listener is listening on port" in line]
    assert said == [out.strip()] and int(said[0]) > 0   # (NIXL's CI reads the last field)
    out, err = run_python(code)  # (NIXL's default level, WARN: not said)
    assert "MD listener" not in err


# ---------------------------------------------------------------- telemetry
def read_events(path):
    """(header, [(event type, value)]) of NIXL's telemetry file, popped as NIXL's reader pops
    them (read_pos moves on)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        write, read, version, expected, capacity, mask = struct.unpack_from("=QQiiQQ", data, 0)
        events = []
        while read != write:
            events.append(struct.unpack_from("=I4xQ", data, 40 + 16 * read))
            read = (read + 1) & mask
        f.seek(8)
        f.write(struct.pack("=Q", read))
    return (version, expected, capacity, mask), events


def transfer(d, p, room, kv, op="WRITE", n=2):
    h = d.initialize_xfer(op, d.get_xfer_descs([(room.ctypes.data, n * BLOCK, 0)], "DRAM"),
                          d.get_xfer_descs([(kv.ctypes.data, n * BLOCK, 0)], "DRAM"), "P")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")
    return h


def test_telemetry_environment_overrides_the_config_both_ways(monkeypatch):
    kv, room = np.ones(2 * BLOCK, np.uint8), np.zeros(2 * BLOCK, np.uint8)
    p = nixl_agent("P")
    p.register_memory([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM")
    cases = (("y", False, True), ("no", True, False), (None, True, True), (None, False, False))
    for env, capture, on in cases:
        if env is None:
            monkeypatch.delenv("NIXL_TELEMETRY_ENABLE", raising=False)
        else:
            monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", env)
        d = nixl_agent("D", nixl_agent_config(capture_telemetry=capture))
        d.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")
        d.add_remote_agent(p.get_agent_metadata())
        h = transfer(d, p, room, kv)
        if on:
            assert d.get_xfer_telemetry(h).totalBytes == 2 * BLOCK
        else:
            with pytest.raises(nb.nixlNoTelemetryError):
                d.get_xfer_telemetry(h)
        d.close()
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "maybe")
    with pytest.raises(ValueError, match="NIXL_TELEMETRY_ENABLE"):
        nixl_agent("D")


def test_telemetry_events_go_to_the_agents_file_in_nixls_format(monkeypatch, tmp_path):
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "yes")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    kv, room = np.ones(2 * BLOCK, np.uint8), np.zeros(2 * BLOCK, np.uint8)
    p, d = nixl_agent("P"), nixl_agent("D")
    p.register_memory([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM")
    reg = d.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")
    d.add_remote_agent(p.get_agent_metadata())
    h = transfer(d, p, room, kv, "WRITE")
    transfer(d, p, room, kv, "READ", n=1)
    d.deregister_memory(reg)
    header, events = read_events(tmp_path / "D")
    assert header == (4, 4, 4096, 4095)
    t = d.get_xfer_telemetry(h)
    assert events[:6] == [(4, 2 * BLOCK), (7, t.postDuration), (6, t.xferDuration), (0, 2 * BLOCK), (2, 1),
                          (7, events[5][1])]
    assert [e for e, _ in events[6:]] == [6, 1, 3, 5]  # (the READ: times, RX bytes and request; deregistered)
    assert events[7] == (1, BLOCK) and events[9] == (5, 2 * BLOCK)
    assert read_events(tmp_path / "D")[1] == []  # (popped: the reader moved read_pos on)
    with pytest.raises(nb.nixlNotFoundError):  # errors are counted too
        d.deregister_memory(reg)
    with pytest.raises(nb.nixlNotAllowedError):
        transfer(d, p, room, np.zeros(2 * BLOCK, np.uint8))
    assert (13, 1) in read_events(tmp_path / "D")[1]  # AGENT_ERR_NOT_ALLOWED


def test_a_transfers_events_go_in_whole_and_its_error_is_counted_once(monkeypatch, tmp_path):
    """As NIXL: a transfer's four events are one all-or-none batch, and a failed transfer's error
    is counted when its status became it, not at each check."""
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "1")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", "8")  # (7 records fit)
    kv, room = np.ones(2 * BLOCK, np.uint8), np.zeros(2 * BLOCK, np.uint8)
    p, d = nixl_agent("P"), nixl_agent("D")
    p.register_memory([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM")
    d.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")  # 1 event
    d.add_remote_agent(p.get_agent_metadata())
    transfer(d, p, room, kv)  # 4 events: 5 in the ring
    transfer(d, p, room, kv)  # 4 more do not fit: none goes in
    assert [e for e, _ in read_events(tmp_path / "D")[1]] == [4, 7, 6, 0, 2]

    class Failed:  # (the engine's request of a transfer that failed: its peer went away)
        def done(self):
            return True

        def wait(self, timeout=None):
            raise xfer.ConnectionLostError("the peer went away")

    h = d.initialize_xfer("READ", d.get_xfer_descs([(room.ctypes.data, BLOCK, 0)], "DRAM"),
                          d.get_xfer_descs([(kv.ctypes.data, BLOCK, 0)], "DRAM"), "P")
    monkeypatch.setattr(d.agent, "_submit", lambda xfer, notif: Failed())
    with pytest.raises(nb.nixlRemoteDisconnectError):
        d.transfer(h)
    for _ in range(3):
        with pytest.raises(nb.nixlRemoteDisconnectError):
            d.check_xfer_state(h)
    assert read_events(tmp_path / "D")[1] == [(20, 4), (17, 1)]  # (the whole batch dropped; one error)


def test_a_full_telemetry_ring_counts_what_it_dropped(monkeypatch, tmp_path):
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "1")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", "4")  # (3 records fit)
    a = nixl_agent("R")
    buf = np.zeros(8 * BLOCK, np.uint8)
    regs = [a.register_memory([(buf.ctypes.data + k * BLOCK, BLOCK, 0, "")], "DRAM") for k in range(5)]
    assert read_events(tmp_path / "R")[1] == [(4, BLOCK)] * 3
    a.deregister_memory(regs[0])
    assert read_events(tmp_path / "R")[1] == [(20, 2), (5, BLOCK)]  # AGENT_TELEMETRY_EVENTS_DROPPED
    monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", "3")
    with pytest.raises(ValueError, match="power of 2"):
        nixl_agent("R2")
    monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", "8")
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLED_METRICS", "agent_memory_de*")
    b = nixl_agent("M")
    b.deregister_memory(b.register_memory([(buf.ctypes.data, BLOCK, 0, "")], "DRAM"))
    assert read_events(tmp_path / "M")[1] == [(5, BLOCK)]
    monkeypatch.setenv("NIXL_TELEMETRY_EXPORTER", "PROMETHEUS")
    with pytest.raises(nb.nixlNotSupportedError, match="PROMETHEUS"):
        nixl_agent("X")


# ---------------------------------------------------------------- partial metadata
def partial_pair():
    """P with two registered halves; D with room for a half."""
    kv = np.arange(4 * BLOCK, dtype=np.uint32).view(np.uint8)[:4 * BLOCK].copy()
    p = nixl_agent("P", nixl_agent_config(True, True, 0))
    d = nixl_agent("D", nixl_agent_config(True, True, 0))
    first = p.register_memory([(kv.ctypes.data, 2 * BLOCK, 0, "")], "DRAM")
    second = p.register_memory([(kv.ctypes.data + 2 * BLOCK, 2 * BLOCK, 0, "")], "DRAM")
    room = np.zeros(2 * BLOCK, np.uint8)
    d.register_memory([(room.ctypes.data, room.nbytes, 0, "")], "DRAM")
    return p, d, kv, room, first, second


def test_partial_metadata_checks_region_tables():
    """Partial metadata's regions are kept sorted without repeats (sent again, they add nothing)
    and checked with a binary search: a descriptor is accepted when it lies within one region."""
    p, d, kv, room, first, second = partial_pair()
    for _ in range(3):
        d.add_remote_agent(p.get_partial_agent_metadata(first, True))
    assert len(d.agent._agents.exposed("P")) == 1
    d.add_remote_agent(p.get_partial_agent_metadata(second, True))
    across = d.get_xfer_descs([(kv.ctypes.data + BLOCK, 2 * BLOCK, 0)], "DRAM")  # (over both halves)
    assert d.check_remote_metadata("P", first.trim()) and d.check_remote_metadata("P", second.trim())
    assert not d.check_remote_metadata("P", across)
    with pytest.raises(nb.nixlNotFoundError):  # (a backend that is not the agent's)
        p.agent.getLocalPartialMD(first, True, [12345])
    # The table against the question it answers, on random regions (nested, overlapping, repeated).
    rng = np.random.default_rng(3)
    regions = [(int(a), int(n)) for a, n in zip(rng.integers(0, 1000, 300), rng.integers(0, 60, 300))]
    table = _wire.region_table(regions[:150], _wire.region_table(regions[150:]))
    rows = np.stack([rng.integers(0, 1100, 2000), rng.integers(0, 40, 2000)], 1).astype(np.uint64)
    expected = [not any(a <= x and x + n <= a + m for a, m in regions) for x, n in rows.tolist()]
    assert _wire.outside(table, rows).tolist() == expected
    assert (np.diff(table[:, 0].astype(np.int64)) > 0).all()
    assert _wire.outside(table, np.array([[2**64 - 8, 16]], np.uint64)).all()  # (wraps around)
    assert _wire.outside(_wire.region_table([]), rows[:1]).all()


def read_half(d, room, descs):
    h = d.initialize_xfer("READ", d.get_xfer_descs([(room.ctypes.data, room.nbytes, 0)], "DRAM"), descs, "P")
    d.transfer(h)
    wait_for(lambda: d.check_xfer_state(h) == "DONE")


def test_partial_metadata_gives_only_its_descriptors_and_the_rest_is_refused():
    p, d, kv, room, first, second = partial_pair()
    first_x, second_x = first.trim(), second.trim()
    p.send_partial_agent_metadata(first, True, ["UCX"], "127.0.0.1", d.get_listen_port())
    wait_for(lambda: d.check_remote_metadata("P", first_x))
    assert d.check_remote_metadata("P") and not d.check_remote_metadata("P", second_x)
    read_half(d, room, first_x)
    assert (room == kv[:2 * BLOCK]).all()
    with pytest.raises(nb.nixlNotFoundError, match="partial metadata"):  # (as NIXL: never sent)
        read_half(d, room, second_x)
    with pytest.raises(nb.nixlNotFoundError):
        d.prep_xfer_dlist("P", second_x)
    # The rest sent later adds to it; then it is read as well.
    p.send_partial_agent_metadata(second, False, [], "127.0.0.1", d.get_listen_port())
    wait_for(lambda: d.check_remote_metadata("P", second_x))
    read_half(d, room, second_x)
    assert (room == kv[2 * BLOCK:]).all()
    # Without connection info, partial metadata adds to an agent known already only.
    q = nixl_agent("Q")
    with pytest.raises(nb.nixlNotFoundError, match="connection info"):
        q.add_remote_agent(p.get_partial_agent_metadata(first, False))
    with pytest.raises(nb.nixlNotFoundError):  # (memory this agent did not register)
        p.get_partial_agent_metadata(p.get_reg_descs([(room.ctypes.data, BLOCK, 0, "")], "DRAM"))
    # Whole metadata gives every region.
    assert q.add_remote_agent(p.get_partial_agent_metadata(nb.nixlRegDList(nb.DRAM_SEG), True)) == b"P"
    assert q.check_remote_metadata("P") and not q.check_remote_metadata("P", first_x)
    q.add_remote_agent(p.get_agent_metadata())
    assert q.check_remote_metadata("P", first_x) and q.check_remote_metadata("P", second_x)


def test_partial_metadata_through_etcd_by_label(etcd, monkeypatch):
    endpoint = etcd[len("etcd://"):].split("/")[0]
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://{endpoint}")
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", "/nixl/partial")
    p, d, kv, room, first, second = partial_pair()
    with pytest.raises(nb.nixlInvalidParamError, match="label"):
        p.send_partial_agent_metadata(first, True, ["UCX"])
    p.send_partial_agent_metadata(first, True, ["UCX"], label="one")
    d.fetch_remote_metadata("P", label="one")
    d.fetch_remote_metadata("P", label="two")  # (while P is looked up: asked too once it is found)
    wait_for(lambda: d.check_remote_metadata("P", first.trim()))
    with pytest.raises(nb.nixlNotFoundError):
        read_half(d, room, second.trim())
    # Asked before it is served: P keeps the request, answered once it is (not with anything else).
    wait_for(lambda: "two" in p.agent._agents._waiting, timeout=10)
    assert not d.check_remote_metadata("P", second.trim())
    p.send_partial_agent_metadata(second, True, ["UCX"], label="two")
    wait_for(lambda: d.check_remote_metadata("P", second.trim()))
    read_half(d, room, second.trim())
    assert (room == kv[2 * BLOCK:]).all()


def test_an_etcd_label_request_that_could_not_be_sent_is_sent_again(etcd, monkeypatch):
    endpoint = etcd[len("etcd://"):].split("/")[0]
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://{endpoint}")
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", "/nixl/resent")
    p, d, kv, room, first, second = partial_pair()
    p.send_partial_agent_metadata(first, True, ["UCX"], label="one")
    agents, failed = d.agent._agents, []
    real_tell = agents.tell

    def tell(address, kind, payload=None):  # (the first request for metadata is lost)
        if kind == _wire.Message.ASK and not failed:
            failed.append(address)
            raise xfer.ConnectionLostError("lost on the way")
        return real_tell(address, kind, payload)

    monkeypatch.setattr(agents, "tell", tell)
    d.fetch_remote_metadata("P", label="one")
    wait_for(lambda: d.check_remote_metadata("P", first.trim()))  # (returns False meanwhile: no raise)
    assert failed


# ---------------------------------------------------------------- releases
def test_a_transfer_released_while_its_posting_waited_is_not_posted(monkeypatch):
    a = nb.nixlAgent("Rel", nb.nixlAgentConfig())
    buf = np.zeros(2 * BLOCK, np.uint8)
    a.registerMem(nb.nixlRegDList(nb.DRAM_SEG, [(buf.ctypes.data, buf.nbytes, 0, "")]))
    h = a.createXferReq(nb.NIXL_WRITE, nb.nixlXferDList(nb.DRAM_SEG, [(buf.ctypes.data, BLOCK, 0)]),
                        nb.nixlXferDList(nb.DRAM_SEG, [(buf.ctypes.data + BLOCK, BLOCK, 0)]), "Rel")
    found, lookup = [], a._xfer

    def lookup_then_release(handle):  # (another thread releases it between the lookup and the lock)
        found.append(lookup(handle))
        monkeypatch.setattr(a, "_xfer", lookup)  # (once)
        a.releaseXferReq(handle)
        return found[-1]

    monkeypatch.setattr(a, "_xfer", lookup_then_release)
    with pytest.raises(nb.nixlInvalidParamError, match="released"):
        a.postXferReq(h)
    assert found[0].request is None and not found[0].posted


# ---------------------------------------------------------------- query_memory
def test_posix_answers_query_memory_with_file_sizes(tmp_path):
    a = nixl_agent("files", nixl_agent_config(backends=[]))
    assert a.get_plugin_params("POSIX") == {} and a.get_plugin_mem_types("POSIX") == ["FILE_SEG"]
    with pytest.raises(ValueError, match="Backend 'POSIX' not found"):
        a.query_memory([(0, 0, 0, "x")], "POSIX", "FILE")
    a.create_backend("POSIX")
    assert a.get_backend_mem_types("POSIX") == ["FILE_SEG"]
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(b"x" * 5000)
    small.write_bytes(b"12345")
    got = a.query_memory([(0, 0, 0, str(big)), (0, 0, 0, str(tmp_path / "none")), (0, 0, 0, str(small))],
                         "POSIX", "FILE")
    assert [r and r["size"] for r in got] == ["5000", None, "5"]
    assert got[0]["mode"] == str(os.stat(big).st_mode) and got[0]["mtime"] == str(int(os.stat(big).st_mtime))
    assert a.query_memory(nb.nixlRegDList(nb.FILE_SEG), "POSIX") == []
    a.create_backend("UCX")
    with pytest.raises(nb.nixlNotSupportedError, match="POSIX does"):
        a.query_memory([(0, 0, 0, str(big))], "UCX", "FILE")
    with pytest.raises(nb.nixlNotSupportedError, match="FILE_SEG"):  # (POSIX answers queries only)
        a.register_memory([(0, 0, 0, str(big))], "FILE")
