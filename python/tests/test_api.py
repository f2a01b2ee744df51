"""The package's own behaviour in one process: options, memory, descriptors, lifetime."""

import array
import asyncio
import gc
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import xfer


@pytest.fixture
def engine():
    with xfer.Engine("127.0.0.1:0") as e:
        yield e


def test_times_of_any_size_are_taken_in_seconds():
    # (Below 0.1 ms a float prints with an exponent: the engine reads it all the same.)
    for spin in (0.00005, 5e-06, 0, 1):
        with xfer.Engine("127.0.0.1", spin=spin, heartbeat_interval=0.25, heartbeat_timeout=1.5):
            pass


def test_options_are_checked_by_name_and_type():
    with pytest.raises(xfer.InvalidArgumentError, match="unknown engine option \"tcp_linx\""):
        xfer.Engine("127.0.0.1", tcp_linx=4)
    with pytest.raises(xfer.InvalidArgumentError, match="tcp_links must be an integer"):
        xfer.Engine("127.0.0.1", tcp_links="4")
    with pytest.raises(xfer.InvalidArgumentError, match="staging must be"):
        xfer.Engine("127.0.0.1", staging="sometimes")
    with pytest.raises(xfer.InvalidArgumentError):  # out of the engine's range (1..64)
        xfer.Engine("127.0.0.1", tcp_links=0)
    with pytest.raises(xfer.InvalidArgumentError):
        xfer.Engine("not a host name:99999")
    with xfer.Engine("127.0.0.1", timeout=2.5, heartbeat_timeout=5, tcp_links=3) as e:
        assert e.timeout == 2.5
    assert "tcp_links" in xfer.option_names() and "timeout" in xfer.option_names()


def test_an_engine_closes_once_and_refuses_calls_after(engine):
    name = engine.name
    assert name.startswith("127.0.0.1:") and not engine.closed
    engine.close()
    engine.close()
    assert engine.closed and "closed" in repr(engine)
    with pytest.raises(xfer.InvalidArgumentError, match="closed"):
        engine.connect(name)


def test_register_accepts_what_users_have(engine):
    a = np.zeros(4096, np.float32)
    r = engine.register(a, tag="np")
    assert (r.addr, r.len, r.kind, r.tag) == (a.ctypes.data, a.nbytes, "host", "np") and r.registered
    b = bytearray(100)
    assert engine.register(b).len == 100
    with pytest.raises(BufferError):
        b.extend(b"x")  # registered memory cannot move
    assert engine.register(array.array("d", [0.0] * 8)).len == 64
    raw = np.zeros(64, np.uint8)
    assert engine.register((raw.ctypes.data, 64, "host")).len == 64

    class Interface:  # only __array_interface__
        def __init__(self, arr):
            self.arr = arr
            self.__array_interface__ = arr.__array_interface__

    assert engine.register(Interface(np.zeros((4, 4), np.int64))).len == 128
    engine.deregister(r)
    assert not r.registered
    engine.deregister(r)  # twice: nothing


def test_register_refuses_what_peers_could_not_safely_use(engine):
    with pytest.raises(xfer.InvalidArgumentError, match="writable"):
        engine.register(b"immutable bytes")
    with pytest.raises((xfer.InvalidArgumentError, ValueError), match="contiguous"):
        engine.register(np.zeros((8, 8))[:, ::2])
    with pytest.raises(TypeError, match="cannot register a int"):
        engine.register(5)
    with pytest.raises(ValueError, match="memory kind"):
        engine.register((1, 2, "disk"))
    with pytest.raises(xfer.InvalidArgumentError):
        engine.register(bytearray())  # zero length


def test_alloc_gives_memory_numpy_reads_without_a_copy(engine):
    buf = engine.alloc(1 << 16, tag="pool")
    assert (buf.len, buf.kind, buf.tag) == (1 << 16, "host", "pool")
    view = np.frombuffer(buf, np.uint32)
    assert view.size == 1 << 14 and not view.any()  # zeroed
    view[:] = 7
    assert np.asarray(buf)[:4].tolist() == [7, 0, 0, 0]
    with pytest.raises(BufferError, match="view"):
        buf.free()
    with pytest.raises(BufferError, match="view"):
        engine.close()
    del view
    buf.free()
    assert buf.freed
    with pytest.raises(BufferError, match="freed"):
        memoryview(buf)


def test_transfers_within_one_engine_and_descriptor_forms(engine):
    buf = engine.alloc(1 << 20)
    dst = np.frombuffer(buf, np.uint8)
    src = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8)
    me = engine.name
    engine.write(me, [(src.ctypes.data, buf.addr, 1000)])
    engine.write(me, [[src.ctypes.data + 1000, buf.addr + 1000, 1000]])
    triples = np.array([[src.ctypes.data + 2000, buf.addr + 2000, 1000]], np.uint64)
    engine.write(me, triples)
    engine.write(me, local=[src.ctypes.data + 3000], remote=np.array([buf.addr + 3000], np.int64),
                 length=np.int64(1000))
    assert np.array_equal(dst[:4000], src[:4000])
    with pytest.raises(xfer.InvalidArgumentError, match="shape"):
        engine.write(me, np.zeros((2, 2), np.uint64))
    with pytest.raises(xfer.InvalidArgumentError, match="not both"):
        engine.write(me, [(src.ctypes.data, buf.addr, 1)], local=[1], remote=[1], length=1)
    with pytest.raises(xfer.InvalidArgumentError, match="all three"):
        engine.write(me, local=[1])
    with pytest.raises(xfer.InvalidArgumentError, match="a notification must be"):
        engine.write(me, [(src.ctypes.data, buf.addr, 1)], notify=5)
    with pytest.raises(xfer.InvalidArgumentError, match="not an integer"):
        engine.write(me, [(src.ctypes.data, buf.addr, True)])
    engine.write(me, [(src.ctypes.data, buf.addr, 1)], timeout=np.float32(2.5), notify=bytearray(b"ba"))
    engine.send_notify(me, memoryview(b"mv"), timeout=np.int64(5))
    assert [n.message for n in engine.wait_notifies(timeout=5)] == [b"ba", b"mv"]
    with pytest.raises(xfer.InvalidArgumentError, match="not a bool"):
        engine.write(me, [(src.ctypes.data, buf.addr, 1)], timeout=True)
    del dst


def test_notifications_to_self_and_wait_timeout(engine):
    assert engine.get_notifies() == [] and engine.wait_notifies(timeout=0.01) == []
    engine.send_notify(engine.name, "hello")
    (n,) = engine.wait_notifies(timeout=5)
    assert (n.sender, n.message) == (engine.name, b"hello") and n.sender_incarnation != 0


def test_a_buffer_keeps_its_engine_and_refuses_views_after_close():
    buf = xfer.Engine("127.0.0.1:0").alloc(1 << 16)  # the Engine object itself is dropped
    view = np.frombuffer(buf, np.uint8)
    view[:] = 5  # its memory is still mapped (the engine was not closed under it)
    assert view.sum() == 5 << 16
    del view
    engine = xfer.Engine("127.0.0.1:0")
    other = engine.alloc(4096)
    engine.close()
    with pytest.raises(BufferError, match="closed"):
        memoryview(other)
    other.free()  # after close: nothing to do, no error
    with pytest.raises(xfer.InvalidArgumentError, match="closed"):
        engine.alloc(4096)


def test_an_engine_dropped_without_close_closes_even_holding_its_buffers():
    engine = xfer.Engine("127.0.0.1:0")
    engine.pool = engine.alloc(1 << 16)  # the engine holds its Buffer: no cycle keeps it up
    engine.register(engine.pool)         # (an alloc() buffer registers by range: no view)
    name = engine.name
    del engine
    gc.collect()
    with xfer.Engine("127.0.0.1") as probe, pytest.raises(xfer.XferError):
        probe.connect(name, timeout=2)  # nobody listens there any more


def test_memory_registered_twice_stays_until_both_are_deregistered(engine):
    a = np.zeros(1 << 16, np.uint8)
    first, second = engine.register(a), engine.register(a)
    assert first.handle == second.handle

    def listed():
        return any(r.addr == a.ctypes.data for r in engine.remote_regions(engine.name))

    engine.deregister(second)
    assert listed() and first.registered
    engine.deregister(first)
    assert not listed()


def test_close_ends_other_threads_waits_soon(engine):
    outcome = []

    def wait():
        try:
            outcome.append(engine.wait_notifies(timeout=60))
        except xfer.XferError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    engine.close()
    waiter.join(30)
    assert time.monotonic() - t0 < 10, "close() waited for the other thread's whole timeout"
    assert len(outcome) == 1 and isinstance(outcome[0], xfer.InvalidArgumentError)


def test_asyncio_await_of_a_failed_request_raises(engine):
    buf = engine.alloc(4096)
    src = np.zeros(8192, np.uint8)

    async def run():
        return await engine.write_async(engine.name, [(src.ctypes.data, buf.addr, 8192)])

    with pytest.raises(xfer.RemoteAccessDeniedError):
        asyncio.run(run())


def test_help_reads_well():
    text = xfer.Engine.__doc__ + xfer.Engine.write.__doc__ + xfer.Engine.register.__doc__
    for words in ("context manager", "local_addr", "notify", "buffer protocol", "GIL"):
        assert words in text
    for cls in (xfer.TimeoutError, xfer.ConnectionLostError, xfer.RemoteAccessDeniedError):
        assert issubclass(cls, xfer.XferError) and cls.__doc__
    assert issubclass(xfer.TimeoutError, TimeoutError) and issubclass(xfer.ConnectionLostError, ConnectionError)


def test_a_blocking_call_releases_the_gil(engine):
    # The thread blocks in wait_notifies; only if it let go of the GIL can this thread run on
    # and send the notification it waits for (else it would time out, empty-handed).
    got = []
    waiter = threading.Thread(target=lambda: got.extend(engine.wait_notifies(timeout=20)))
    waiter.start()
    time.sleep(0.2)  # (it is blocked by now, or soon: either way the message reaches it)
    engine.send_notify(engine.name, "from the main thread")
    waiter.join(30)
    assert [n.message for n in got] == [b"from the main thread"]


@pytest.mark.parametrize("option", ["max_sessions", "max_sessions_per_host"])
def test_max_sessions_caps_the_sessions_an_engine_holds(option):
    with xfer.Engine("127.0.0.1:0", **{option: 1}) as e, xfer.Engine("127.0.0.1:0") as a, \
            xfer.Engine("127.0.0.1:0") as b:
        a.connect(e.name)
        with pytest.raises(xfer.ResourceExhaustedError, match=option):
            b.connect(e.name)
        if option == "max_sessions_per_host":
            e.connect(b.name)  # (ours: not the host's)
    with pytest.raises(xfer.InvalidArgumentError, match=option):
        xfer.Engine("127.0.0.1", **{option: 0})


def test_the_version_is_the_one_cmake_declares():
    cmake = (pathlib.Path(__file__).parents[2] / "CMakeLists.txt").read_text()
    assert xfer.__version__ == re.search(r"project\(xfer VERSION ([0-9.]+)", cmake).group(1)


def test_transports_say_what_this_machine_offers():
    states = {t.name: t for t in xfer.transports()}
    assert {"local", "shm", "cma", "tcp", "ucx", "cuda"} <= set(states)
    assert states["tcp"].available and states["tcp"].why_not == ""
    assert not states["cuda"].available or "GPU" in states["cuda"].about
    # Forced off: not available, and why.
    off = {t.name: t for t in xfer.transports(ucx_mode="off")}["ucx"]
    assert not off.available and "ucx.mode" in off.why_not
    with pytest.raises(xfer.InvalidArgumentError):
        xfer.transports(no_such_option=1)
    # python -m xfer.info prints the same.
    out = subprocess.run([sys.executable, "-m", "xfer.info"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"xfer {xfer.__version__}\n")
    assert re.search(r"^  tcp +available", out, re.M)


def test_a_ucx_the_process_loaded_already_is_the_one_used():
    # (A fresh process: the engine loads UCX once per process.) The libucx wheel's UCX, loaded
    # before xfer starts its ucx transport, is used rather than the system's.
    pytest.importorskip("libucx")
    code = ("import libucx; libucx.load_library(); import xfer; "
            "print(next(t.about for t in xfer.transports(ucx_mode='on') if t.name == 'ucx'))")
    about = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "site-packages/libucx/lib/libucp" in about, about
