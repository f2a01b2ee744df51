"""xfer.mooncake driven the way a Mooncake user drives mooncake.engine.TransferEngine: a target
process that only initializes, an initiator that writes, clears, reads back and compares."""

import os
import sys
import time

import numpy as np
import pytest

from conftest import Child
from xfer.mooncake import ERR_METADATA, ERR_SOCKET, TransferEngine, TransferNotify, TransferOpcode

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def target():
    child = Child([sys.executable, os.path.join(HERE, "mooncake_target.py")])
    try:
        hello = child.recv(30)
        assert hello["rc"] == 0
        yield child, hello["segment"]
    finally:
        child.close()


def target_notifies(child):
    return child.call("notifies")


@pytest.fixture
def engine():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    yield e
    e.close()


def test_write_clear_read_back_compare(target, engine):
    _, segment = target
    remote = engine.get_first_buffer_address(segment)
    assert remote != 0
    n = 1 << 20
    buf = engine.allocate_managed_buffer(n)
    assert buf != 0
    data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert engine.write_bytes_to_buffer(buf, data, n) == 0
    assert engine.transfer_sync_write(segment, buf, remote, n) == 0
    assert engine.write_bytes_to_buffer(buf, bytes(n), n) == 0
    assert engine.transfer_sync_read(segment, buf, remote, n) == 0
    assert engine.read_bytes_from_buffer(buf, n) == data
    assert engine.transfer_sync(segment, buf, remote, 4096, TransferOpcode.Write) == 0
    assert engine.free_managed_buffer(buf, n) == 0


def test_batched_sync_and_async(target, engine):
    _, segment = target
    remote = engine.get_first_buffer_address(segment)
    blocks, size = 64, 16 << 10
    bufs = [engine.allocate_managed_buffer(size) for _ in range(blocks)]
    peers = [remote + k * size for k in range(blocks)]
    lengths = [size] * blocks
    payload = [bytes([k]) * size for k in range(blocks)]
    for b, p in zip(bufs, payload):
        engine.write_bytes_to_buffer(b, p, size)
    assert engine.batch_transfer_sync_write(segment, bufs, peers, lengths) == 0
    for b in bufs:
        engine.write_bytes_to_buffer(b, bytes(size), size)
    assert engine.batch_transfer_sync_read(segment, bufs, peers, lengths) == 0
    assert [engine.read_bytes_from_buffer(b, size) for b in bufs] == payload

    for b in bufs:
        engine.write_bytes_to_buffer(b, bytes(size), size)
    batch = engine.batch_transfer_async_read(segment, bufs, peers, lengths)
    assert batch > 0
    assert engine.get_batch_transfer_status([batch]) == 0
    assert [engine.read_bytes_from_buffer(b, size) for b in bufs] == payload
    ids = [engine.batch_transfer_async(segment, bufs[k:k + 8], peers[k:k + 8], lengths[:8], TransferOpcode.WRITE)
           for k in range(0, blocks, 8)]
    assert all(ids) and engine.get_batch_transfer_status(ids) == 0
    assert engine.get_batch_transfer_status(ids) == -1  # released: no longer batches


def test_submit_and_check_status(target, engine):
    _, segment = target
    remote = engine.get_first_buffer_address(segment)
    buf = engine.allocate_managed_buffer(8 << 20)
    batch = engine.transfer_submit_write(segment, buf, remote, 8 << 20)
    assert batch > 0
    until = time.monotonic() + 30
    while (status := engine.transfer_check_status(batch)) == 0:
        assert time.monotonic() < until
        time.sleep(0.001)
    assert status == 1
    assert engine.transfer_check_status(batch) == -1  # reported once, then released


def test_notifications_carry_name_and_message(target, engine):
    proc, segment = target
    remote = engine.get_first_buffer_address(segment)
    buf = engine.allocate_managed_buffer(4096)
    assert engine.transfer_sync(segment, buf, remote, 4096, TransferOpcode.WRITE,
                                TransferNotify("req-7", "blocks ready")) == 0
    assert engine.batch_transfer_sync(segment, [buf], [remote], [4096], TransferOpcode.READ,
                                      TransferNotify("req-8", "read done")) == 0
    assert target_notifies(proc) == [["req-7", "blocks ready"], ["req-8", "read done"]]
    assert engine.get_notifies() == []
    # Metadata of some KiB rides along (up to 1 MiB, name and message: 9 bytes are framing).
    longest = "m" * ((1 << 20) - 9 - len("req-9"))
    assert engine.transfer_sync(segment, buf, remote, 4096, TransferOpcode.WRITE,
                                TransferNotify("req-9", longest)) == 0
    assert target_notifies(proc) == [["req-9", longest]]
    assert engine.transfer_sync(segment, buf, remote, 4096, TransferOpcode.WRITE,
                                TransferNotify("req-9", longest + "m")) == -1


def test_failures_are_negative_codes_not_exceptions(target, engine):
    _, segment = target
    remote = engine.get_first_buffer_address(segment)
    buf = engine.allocate_managed_buffer(4096)
    pool = int(os.environ.get("XFER_MOONCAKE_POOL_BYTES", 256 << 20))
    assert engine.transfer_sync_write(segment, buf, remote + pool - 100, 4096) < 0  # outside the region
    assert engine.transfer_sync_read("127.0.0.1:1", buf, remote, 4096) < 0          # nobody there
    assert engine.batch_transfer_sync_write(segment, [buf], [remote], [1, 2]) < 0
    batch = engine.batch_transfer_async_write(segment, [buf], [remote + pool], [4096])
    assert batch == 0 or engine.get_batch_transfer_status([batch]) < 0
    assert engine.write_bytes_to_buffer(12345, b"xx", 2) < 0
    assert engine.write_bytes_to_buffer(buf, b"abc", -1) < 0
    with pytest.raises(ValueError):
        engine.read_bytes_from_buffer(buf, -1)
    with pytest.raises(ValueError):
        engine.read_bytes_from_buffer(12345, 2)
    assert engine.free_managed_buffer(12345, 1) < 0
    assert engine.unregister_memory(12345) < 0
    assert TransferEngine().initialize("127.0.0.1", "etcd://127.0.0.1:2379", "tcp", "") < 0
    assert TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", "") < 0


def test_register_memory_and_local_segment(engine):
    a = np.zeros(1 << 16, np.uint8)
    assert engine.register_memory(a.ctypes.data, a.nbytes) == 0
    assert engine.register_memory(a.ctypes.data, a.nbytes) < 0  # the same again
    b = np.zeros(4096, np.uint8)
    assert engine.batch_register_memory([b.ctypes.data], [b.nbytes]) == 0
    local = f"127.0.0.1:{engine.get_rpc_port()}"
    assert engine.get_first_buffer_address(local) == engine.get_first_buffer_address(local) != 0
    assert engine.transfer_sync_write(local, a.ctypes.data, engine.get_first_buffer_address(local), 4096) == 0
    assert engine.batch_unregister_memory([a.ctypes.data, b.ctypes.data]) == 0
    big = engine.allocate_managed_buffer(512 << 20)  # more than the pool: a buffer of its own
    assert big != 0 and engine.free_managed_buffer(big, 512 << 20) == 0
    assert TransferOpcode.Read == TransferOpcode.READ == 0 and TransferOpcode.Write == 1


@pytest.mark.parametrize("service", ["etcd", "http_metadata"])
def test_a_metadata_server_names_segments_by_local_hostname(service, request):
    """Mooncake's metadata-server modes: segments are named by the local_hostname each engine
    was initialized with, published in etcd (given as etcd://host:port or, as Mooncake reads it,
    a bare host:port) or in an HTTP metadata server (Mooncake's protocol, its http://host:port/metadata)."""
    if service == "etcd":
        endpoint = request.getfixturevalue("etcd")[len("etcd://"):].split("/")[0]
        theirs, mine = f"etcd://{endpoint}", endpoint
    else:
        theirs, store = request.getfixturevalue("http_metadata")
        mine = theirs
    child = Child([sys.executable, os.path.join(HERE, "mooncake_target.py"), "--allocate", str(1 << 20),
                   "--host", "127.0.0.1:7001", "--metadata", theirs])
    e = TransferEngine()
    try:
        hello = child.recv(30)
        assert hello == {"rc": 0, "segment": "127.0.0.1:7001"}
        assert e.initialize("127.0.0.1:7002", mine, "tcp", "") == 0
        if service == "http_metadata":
            assert {"xfer/engines/127.0.0.1_7001", "xfer/engines/127.0.0.1_7002"} <= set(store)
        remote = e.get_first_buffer_address("127.0.0.1:7001")
        assert remote != 0
        buf = e.allocate_managed_buffer(4096)
        data = np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes()
        e.write_bytes_to_buffer(buf, data, 4096)
        assert e.transfer_sync_write("127.0.0.1:7001", buf, remote, 4096) == 0
        e.write_bytes_to_buffer(buf, bytes(4096), 4096)
        assert e.transfer_sync_read("127.0.0.1:7001", buf, remote, 4096) == 0
        assert e.read_bytes_from_buffer(buf, 4096) == data
        assert e.transfer_sync_write("127.0.0.1:7009", buf, remote, 4096) < 0  # no such segment
        assert e.get_first_buffer_address("127.0.0.1:7002") != 0  # its own segment, by its name
        # Mooncake's codes: a probe of a known segment answers 0, of an unknown one ERR_METADATA;
        # submits to an unknown one give the batch-id sentinel 0.
        assert e.send_probe("127.0.0.1:7001") == 0
        assert e.send_probe("127.0.0.1:7001") == 0  # (connected already)
        assert e.send_probe("unreachable_peer:9") == ERR_METADATA
        assert e.transfer_submit_write("unreachable_peer:9", buf, 0, 16) == 0
        assert e.batch_transfer_async_write("unreachable_peer:9", [buf], [0], [16]) == 0
    finally:
        e.close()
        child.close()
    if service == "http_metadata":  # (a clean close withdraws the entry)
        assert "xfer/engines/127.0.0.1_7002" not in store


def test_send_probe_by_address(target, engine):
    _, segment = target
    assert engine.send_probe(segment) == 0
    assert engine.send_probe("127.0.0.1:1") == ERR_SOCKET  # nobody there
    assert TransferEngine().send_probe(segment) < 0  # not initialized


def test_unsupported_metadata_servers_are_refused():
    bad = TransferEngine()
    assert bad.initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") == -1
    assert bad.initialize_ext("127.0.0.1", "127.0.0.1:1", "tcp", "", "redis") == -1
    assert bad.initialize_ext("127.0.0.1", "http://127.0.0.1:1/metadata", "tcp", "", "etcd") == -1
