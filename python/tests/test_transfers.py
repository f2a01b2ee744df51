"""Transfers between this process and a peer process, over shm, cma, tcp and ucx."""

import asyncio
import hashlib
import sys
import threading
import time

import numpy as np
import pytest

import xfer
from conftest import Child

SIZES = [1, 7, 4096, 65537, 1 << 20, 64 << 20]


def sha(a):
    return hashlib.sha1(a.tobytes()).hexdigest()


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_round_trips_of_random_data(pair):
    engine, peer, route = pair
    for i, n in enumerate(SIZES):
        src, back = random_bytes(n, i), np.zeros(n, np.uint8)
        engine.write(peer.name, [(src.ctypes.data, peer.addr, n)])
        assert peer.sha(0, n) == sha(src), f"{n} bytes written"
        engine.read(peer.name, [(back.ctypes.data, peer.addr, n)])
        assert np.array_equal(back, src), f"{n} bytes read back"
    moved = engine.peer_info(peer.name).moved
    assert moved.get(route, 0) >= 2 * sum(SIZES), moved


def test_a_hundred_thousand_descriptors_from_numpy_arrays(pair):
    engine, peer, _ = pair
    n, block = 100_000, 512  # 100,000 descriptors over 48.8 MiB, in a shuffled order
    src = random_bytes(n * block, 1)
    order = np.random.default_rng(2).permutation(n).astype(np.uint64)
    local = src.ctypes.data + order * block
    remote = peer.addr + np.arange(n, dtype=np.uint64) * block
    engine.write(peer.name, local=local, remote=remote, length=block)
    expected = src.reshape(n, block)[order].reshape(-1)
    assert peer.sha(0, n * block) == sha(expected)
    back = np.zeros_like(src)
    engine.read(peer.name, local=back.ctypes.data + order * block, remote=remote,
                length=np.full(n, block, np.int64))
    assert np.array_equal(back, src)


def test_async_requests_and_asyncio(pair):
    engine, peer, _ = pair
    src = random_bytes(8 << 20, 3)
    requests = [engine.write_async(peer.name, [(src.ctypes.data + k * (1 << 20), peer.addr + k * (1 << 20), 1 << 20)])
                for k in range(8)]
    assert all(r.wait(30) for r in requests)
    assert all(r.done() and r.status() == xfer.State.COMPLETED for r in requests)
    assert peer.sha(0, 8 << 20) == sha(src)

    async def read_back():
        back = np.zeros_like(src)
        done = await asyncio.gather(*[engine.read_async(peer.name, [(back.ctypes.data + k * (1 << 20), peer.addr + k * (1 << 20), 1 << 20)])
                                      for k in range(8)])
        return done, back

    done, back = asyncio.run(read_back())
    assert done == [True] * 8 and np.array_equal(back, src)


def long_write(engine, peer, timeout, notify=None):
    """A request of 8 GiB (one 256 KiB descriptor per batch, over the peer's 64 MiB, 128 times)."""
    block, blocks = 256 << 10, 256
    src = random_bytes(block * blocks, 4)
    k = np.arange(128 * blocks, dtype=np.uint64) % blocks
    request = engine.write_async(peer.name, local=src.ctypes.data + k * block, remote=peer.addr + k * block,
                                 length=block, timeout=timeout, notify=notify)
    return request, src


def wait_until_moving(engine, peer, route, nbytes=1 << 20):
    until = time.monotonic() + 20
    while engine.peer_info(peer.name).moved.get(route, 0) < nbytes:
        assert time.monotonic() < until, "the request did not start moving"
        time.sleep(0.0005)


def test_cancel_and_deadline(pair):
    engine, peer, route = pair
    request, _ = long_write(engine, peer, timeout=60)
    wait_until_moving(engine, peer, route)
    request.cancel()
    with pytest.raises(xfer.CanceledError) as e:
        request.wait(30)
    assert request.status() == xfer.State.CANCELED
    assert 0 < len(e.value.landed) < 128 * 256 and e.value.landed == request.landed

    request, _ = long_write(engine, peer, timeout=0.05)
    with pytest.raises(xfer.TimeoutError) as e:
        request.wait(30)
    assert isinstance(e.value, TimeoutError) and e.value.code == "TIMEOUT"
    assert request.status() == xfer.State.TIMEOUT
    with pytest.raises(xfer.TimeoutError):  # asked again: the same answer, at once
        request.wait(0)


@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_requests_end_canceled_when_the_engine_closes(pair):
    engine, peer, route = pair
    request, _ = long_write(engine, peer, timeout=60)
    wait_until_moving(engine, peer, route)
    engine.close()
    with pytest.raises(xfer.CanceledError):
        request.wait(30)
    assert request.status() == xfer.State.CANCELED


@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_a_transfer_in_one_thread_lets_the_others_run(pair):
    engine, peer, _ = pair
    block = 32 << 20
    src = random_bytes(block, 6)
    k = np.arange(64, dtype=np.uint64) % 2  # 2 GiB over 64 MiB of the peer
    writer = threading.Thread(target=lambda: engine.write(peer.name, local=src.ctypes.data + 0 * k,
                                                          remote=peer.addr + k * block, length=block, timeout=120))
    spins = 0
    writer.start()
    while writer.is_alive():  # runs only while the writer's call has let go of the GIL
        spins += 1
    writer.join()
    assert spins > 10_000, f"this thread ran {spins} times during a 2 GiB write: the GIL was held"


def test_canceling_an_asyncio_task_cancels_its_request(pair):
    engine, peer, route = pair

    async def run():
        request, src = long_write(engine, peer, timeout=60)
        task = asyncio.ensure_future(request)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return request, src  # (src: the request reads it until it ended)

    request, src = asyncio.run(run())
    with pytest.raises(xfer.CanceledError):
        request.wait(30)


def test_a_short_wait_is_not_a_failure(pair):
    engine, peer, route = pair
    request, _ = long_write(engine, peer, timeout=60)
    assert request.wait(0.001) is False and not request.done()
    request.cancel()
    with pytest.raises(xfer.CanceledError):
        request.wait()


def test_errors_map_to_exceptions(pair):
    engine, peer, _ = pair
    a = np.zeros(4096, np.uint8)
    with pytest.raises(xfer.RemoteAccessDeniedError) as e:
        engine.write(peer.name, [(a.ctypes.data, peer.addr + peer.len - 100, 4096)])
    assert isinstance(e.value, PermissionError) and "registered region" in str(e.value)
    with pytest.raises(xfer.NotConnectedError) as e:
        engine.read("127.0.0.1:1", [(a.ctypes.data, 0, 1)])
    assert isinstance(e.value, ConnectionError)
    with pytest.raises(xfer.InvalidArgumentError):
        engine.write(peer.name, [(a.ctypes.data, peer.addr, 0)])
    with pytest.raises(xfer.InvalidArgumentError):
        engine.write(peer.name, [(a.ctypes.data, peer.addr)])
    with pytest.raises(xfer.InvalidArgumentError):
        engine.write(peer.name, local=[a.ctypes.data], remote=[peer.addr, peer.addr], length=1)
    with pytest.raises(xfer.InvalidArgumentError):
        engine.write(peer.name, local=np.array([1.5]), remote=[peer.addr], length=1)
    with pytest.raises(xfer.InvalidArgumentError):
        engine.write(peer.name, local=np.array([-1]), remote=[peer.addr], length=1)
    with pytest.raises(xfer.AlreadyConnectedError):
        engine.connect(peer.name)


def test_a_read_only_region_serves_reads_and_refuses_writes(transport, make_peer):
    name, t = transport
    peer = make_peer(memory=t["memory"], nbytes=1 << 20, options=t["options"], read_only=True)
    peer.call("fill", 0, 1 << 20, 7)
    with xfer.Engine("127.0.0.1", **t["options"]) as engine:
        engine.connect(peer.name)
        [info] = engine.remote_regions(peer.name)
        assert info.read_only and "read-only" in repr(info)
        mine = engine.alloc(1 << 20)  # registered: small copies to shm run inline
        local = np.asarray(mine)
        local[:] = 9
        for size in (8, 4096, 1 << 20):
            with pytest.raises(xfer.RemoteAccessDeniedError, match="read-only"):
                engine.write(peer.name, [(mine.addr, peer.addr, size)])
        assert peer.sha(0, 1 << 20) == sha(np.full(1 << 20, 7, np.uint8))
        engine.read(peer.name, [(mine.addr, peer.addr, 1 << 20)])
        assert (local == 7).all()
        del local
        mine.free()


def test_read_only_is_shown_on_regions_and_buffers():
    with xfer.Engine("127.0.0.1") as engine:
        a = np.zeros(4096, np.uint8)
        ro, rw = engine.register(a, read_only=True), engine.register(a)
        assert ro.read_only and not rw.read_only and ro.handle != rw.handle
        assert "read-only" in repr(ro)
        buf = engine.alloc(4096, read_only=True)
        assert buf.read_only and "read-only" in repr(buf)
        np.asarray(buf)[:] = 1  # this process still writes it
        ro.deregister()
        rw.deregister()


@pytest.mark.parametrize("transport", ["cma", "tcp", "ucx"], indirect=True)
def test_a_peer_killed_mid_transfer(pair):
    engine, peer, route = pair
    request, _ = long_write(engine, peer, timeout=60, notify="never")
    wait_until_moving(engine, peer, route)
    peer.kill()
    with pytest.raises(xfer.ConnectionLostError) as e:
        request.wait(30)
    assert isinstance(e.value, ConnectionError)
    assert request.status() == xfer.State.FAILED and 0 < len(request.landed) < 128 * 256
    with pytest.raises((xfer.ConnectionLostError, xfer.NotConnectedError)):
        engine.write(peer.name, [(0, peer.addr, 1)])


def test_notifications_come_after_the_data_in_order(pair):
    engine, peer, _ = pair
    src = random_bytes(1 << 20, 5)
    for k in range(100):
        engine.write(peer.name, [(src.ctypes.data, peer.addr, 1 << 20)], notify=f"block {k}")
    engine.send_notify(peer.name, b"\x00binary\xff")
    got = peer.call("notifies", 101, 30)["notifies"]
    assert [bytes.fromhex(m) for _, _, m in got] == [f"block {k}".encode() for k in range(100)] + [b"\x00binary\xff"]
    assert {s for s, _, _ in got} == {engine.name}
    async_ = [engine.write_async(peer.name, [(src.ctypes.data, peer.addr, 4096)], notify=b"a") for _ in range(10)]
    assert all(r.wait(30) for r in async_)
    assert len(peer.call("notifies", 10, 30)["notifies"]) == 10
    with pytest.raises(xfer.InvalidArgumentError):
        engine.send_notify(peer.name, "x" * 4097)


@pytest.mark.parametrize("ring_bytes", [0, 4096])
def test_notifications_through_a_small_ring_or_none_keep_their_order(make_peer, ring_bytes):
    # 4 KiB holds 256 of these (the peer takes none until the end): the rest go over the
    # control session, in order all the same.
    peer = make_peer(memory="alloc", nbytes=1 << 20, options={})
    with xfer.Engine("127.0.0.1", notify_ring_bytes=ring_bytes, notify_max_message_bytes=16) as engine:
        engine.connect(peer.name)
        for k in range(500):
            engine.send_notify(peer.name, f"{k:08d}")
        got = peer.call("notifies", 500, 30)["notifies"]
        assert [bytes.fromhex(m) for _, _, m in got] == [f"{k:08d}".encode() for k in range(500)]
    with pytest.raises(xfer.InvalidArgumentError, match="ring_bytes"):
        xfer.Engine("127.0.0.1", notify_ring_bytes=100)


def test_a_target_with_notify_outcomes_hears_of_requests_that_did_not_complete():
    with xfer.Engine("127.0.0.1:0", notify_outcomes=True) as target, xfer.Engine("127.0.0.1") as initiator:
        block = 1 << 20
        region = target.alloc(block)
        src = random_bytes(block, 9)
        initiator.connect(target.name)
        descs = [(src.ctypes.data, region.addr, block)] * 8192  # 8 GiB: never done in 20 ms
        timed_out = initiator.write_async(target.name, descs, timeout=0.02, notify=b"timed out")
        with pytest.raises(xfer.TimeoutError):
            timed_out.wait()
        canceled = initiator.write_async(target.name, descs, timeout=60, notify="canceled")
        canceled.cancel()
        with pytest.raises(xfer.CanceledError):
            canceled.wait()
        initiator.write(target.name, descs[:1], notify=b"done")
        got = []
        while len(got) < 3:
            got += target.wait_notifies(timeout=10)
        assert [(n.message, n.outcome) for n in got] == [
            (b"timed out", xfer.Outcome.TIMED_OUT), (b"canceled", xfer.Outcome.CANCELED),
            (b"done", xfer.Outcome.COMPLETED)]
        assert got[0].landed == timed_out.landed and len(got[0].landed) < 8192
        assert got[1].landed == canceled.landed
        assert got[2].landed == [] and "TIMED_OUT" in repr(got[0])


def test_checksummed_transfers_complete_and_catch_a_flipped_byte(pair, monkeypatch):
    engine, peer, route = pair
    src, back = random_bytes(3 << 20, 5), np.zeros(3 << 20, np.uint8)
    engine.write(peer.name, [(src.ctypes.data, peer.addr, 3 << 20)], checksum=True)
    engine.read(peer.name, [(back.ctypes.data, peer.addr, 3 << 20)], checksum=True)
    assert sha(back) == sha(src)
    with pytest.raises(xfer.InvalidArgumentError, match="checksum must be"):
        engine.write(peer.name, [(src.ctypes.data, peer.addr, 1)], checksum=1)

    # Two engines made while the test hook is set corrupt descriptor 1 where it lands.
    monkeypatch.setenv("XFER_TEST_CORRUPT_LANDED", "1")
    with xfer.Engine("127.0.0.1:0", notify_outcomes=True) as target, \
            xfer.Engine("127.0.0.1", transport="tcp", checksum=True) as initiator:
        monkeypatch.delenv("XFER_TEST_CORRUPT_LANDED")
        region = target.alloc(3 << 20)
        initiator.connect(target.name)
        # (apart and short: each one range of the target's, whose hook counts ranges)
        descs = [(src.ctypes.data + k * (1 << 17), region.addr + k * (1 << 17), 1 << 16) for k in range(3)]
        with pytest.raises(xfer.DataCorruptedError, match="descriptor 1:") as e:
            initiator.write(target.name, descs, notify=b"blocks")
        assert e.value.landed == [0, 2]
        told = target.wait_notifies(timeout=10)
        assert [(n.message, n.outcome, n.landed) for n in told] == [(b"blocks", xfer.Outcome.FAILED, [0, 2])]
        initiator.write(target.name, descs, checksum=False)  # (the hook spares unchecked requests)


# A killed initiator: the target queues each of its notified requests still in flight itself.
LOST_INITIATOR = """
import sys, numpy as np, xfer
target, addr = sys.argv[1], int(sys.argv[2])
engine = xfer.Engine("127.0.0.1")
engine.connect(target)
src = np.ones(1 << 20, np.uint8)
descs = [(src.ctypes.data, addr, 1 << 20)] * 8192  # 8 GiB each
requests = [engine.write_async(target, descs, timeout=60, notify=m) for m in (b"lost-1", None, b"lost-2")]
print("started", flush=True)
sys.stdin.read()
"""


def test_a_killed_initiators_notified_requests_end_as_initiator_lost():
    with xfer.Engine("127.0.0.1:0", notify_outcomes=True) as target:
        region = target.alloc(1 << 20)
        child = Child([sys.executable, "-c", LOST_INITIATOR, target.name, str(region.addr)])
        try:
            assert child.line(30) == "started"
        finally:
            child.kill()
        got = []
        while len(got) < 2:
            more = target.wait_notifies(timeout=10)
            assert more, "no notification for a lost initiator's requests"
            got += more
        assert [(n.message, n.outcome, n.landed) for n in got] == [
            (b"lost-1", xfer.Outcome.INITIATOR_LOST, []), (b"lost-2", xfer.Outcome.INITIATOR_LOST, [])]


def test_many_python_threads_transfer_at_once(pair):
    engine, peer, _ = pair
    threads, rounds, chunk = 8, 50, 64 << 10
    errors = []

    def work(t):
        src, back = random_bytes(chunk, 10 + t), np.zeros(chunk, np.uint8)
        mine = peer.addr + t * chunk
        try:
            for _ in range(rounds):
                engine.write(peer.name, [(src.ctypes.data, mine, chunk)])
                engine.read(peer.name, [(back.ctypes.data, mine, chunk)])
                assert np.array_equal(back, src)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(120)
    assert not errors, errors


def test_torch_tensors_as_users_pass_them(pair):
    torch = pytest.importorskip("torch")
    engine, peer, _ = pair
    src = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    engine.register(src)
    engine.write(peer.name, [(src.data_ptr(), peer.addr, src.numel() * src.element_size())])
    back = torch.zeros_like(src)
    region = engine.register(back, tag="kv")
    assert region.len == 1 << 20 and region.kind == "host"
    engine.read(peer.name, [(back.data_ptr(), peer.addr, region.len)])
    assert torch.equal(back, src)


def test_checksummed_tcp_batches_move_data_both_ways(make_peer):
    peer = make_peer(memory="alloc", nbytes=8 << 20, options={"transport": "tcp"})
    with xfer.Engine("127.0.0.1", transport="tcp", tcp_checksum=True) as engine:
        engine.connect(peer.name)
        data = random_bytes(8 << 20, 5)
        back = np.zeros_like(data)
        engine.register(data), engine.register(back)
        engine.write(peer.name, [(data.ctypes.data, peer.addr, data.nbytes)])
        assert peer.sha(0, data.nbytes) == sha(data)
        engine.read(peer.name, [(back.ctypes.data, peer.addr, back.nbytes)])
        assert sha(back) == sha(data)
    assert issubclass(xfer.DataCorruptedError, xfer.XferError)
    assert xfer.DataCorruptedError.code == "DATA_CORRUPTED"


def test_staged_bytes_name_the_route_that_carried_them(make_peer):
    # staging="always": host memory stands in for GPU memory, every byte through the pool.
    peer = make_peer(memory="alloc", nbytes=1 << 20, options={"transport": "tcp"})
    with xfer.Engine("127.0.0.1", transport="tcp", staging="always") as engine:
        engine.connect(peer.name)
        data = random_bytes(1 << 20, 4)
        engine.register(data)
        engine.write(peer.name, [(data.ctypes.data, peer.addr, data.nbytes)])
        assert peer.sha(0, data.nbytes) == sha(data)
        info = engine.peer_info(peer.name)
        assert info.moved["staged"] == data.nbytes
        assert info.staged_via == {"tcp": data.nbytes}


def test_tcp_nics_name_the_interfaces_data_connections_use(make_peer):
    # (Loopback only here; tests/fault/multinic_test.cc spreads a request over two NICs.)
    peer = make_peer(memory="alloc", nbytes=1 << 20, options={"transport": "tcp", "tcp_nics": "lo"})
    with xfer.Engine("127.0.0.1", transport="tcp", tcp_nics=["127.0.0.1"]) as engine:
        engine.connect(peer.name)
        data = random_bytes(1 << 20, 9)
        engine.register(data)
        engine.write(peer.name, [(data.ctypes.data, peer.addr, data.nbytes)])
        assert peer.sha(0, data.nbytes) == sha(data)
        assert engine.peer_info(peer.name).nic_pairs == {}  # (one pair: lo to lo)
    with pytest.raises(xfer.InvalidArgumentError, match="no-such-nic0"):
        xfer.Engine("127.0.0.1", tcp_nics="lo,no-such-nic0")
    with pytest.raises(xfer.InvalidArgumentError, match="tcp_nics must be a list of strings"):
        xfer.Engine("127.0.0.1", tcp_nics=7)
    # "near:BUS_ID": the interfaces nearest a PCI device; a bus id not on this host is refused.
    with pytest.raises(xfer.InvalidArgumentError, match="no PCI device 0000:fe:1f.7 on this host"):
        xfer.Engine("127.0.0.1", tcp_nics=["near:0000:fe:1f.7"])


def test_peers_authenticate_with_a_shared_secret(make_peer, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(np.random.default_rng(8).bytes(32))
    peer = make_peer(memory="alloc", options={"secret_file": str(secret)})
    src = random_bytes(1 << 20, 9)
    with xfer.Engine("127.0.0.1", secret_file=str(secret), transport="tcp") as engine:
        engine.connect(peer.name)
        engine.register(src)
        engine.write(peer.name, [(src.ctypes.data, peer.addr, src.nbytes)])
        assert engine.peer_info(peer.name).moved["tcp"] == src.nbytes
    assert peer.sha(0, src.nbytes) == sha(src)
    with xfer.Engine("127.0.0.1", secret=b"another secret of 32 bytes......") as wrong:
        with pytest.raises(xfer.RemoteAccessDeniedError, match="secret"):
            wrong.connect(peer.name)
    with xfer.Engine("127.0.0.1") as none:
        with pytest.raises(xfer.RemoteAccessDeniedError, match="authentication required"):
            none.connect(peer.name)
    with pytest.raises(xfer.InvalidArgumentError, match="16 bytes"):
        xfer.Engine("127.0.0.1", secret="short")
