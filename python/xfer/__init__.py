"""xfer: one-sided transfers between registered memories, on shm, cma, tcp, UCX and CUDA.

A process registers memory, connects to peer engines, and READs or WRITEs the peers' registered
memory while their application does nothing::

    import numpy as np, xfer
    with xfer.Engine("127.0.0.1:0") as engine:
        engine.connect("10.0.0.2:5555")
        region = engine.remote_regions("10.0.0.2:5555")[0]
        a = np.zeros(1 << 20, np.uint8)
        engine.register(a)
        engine.read("10.0.0.2:5555", [(a.ctypes.data, region.addr, a.nbytes)])

docs/python.md has the whole API; errors are XferError subclasses (xfer.TimeoutError...).
"""

import asyncio as _asyncio
import threading
import time as _time

from . import _errors, _memory
from ._errors import (AlreadyConnectedError, CanceledError, ConnectionLostError,
                      DataCorruptedError, InternalError, InvalidArgumentError, NotConnectedError,
                      RemoteAccessDeniedError, ResourceExhaustedError, TimeoutError,
                      UnsupportedError, XferError)
from ._xfer import (Buffer, ClusterPeer, Metric, Metrics, MetricSample, Notification, Outcome,
                    PeerInfo, PreparedList, Region, RegionInfo, Request, State, TransportState, option_names,
                    transports)
from . import _xfer

__version__ = _xfer.version  # CMakeLists.txt's project(VERSION), as the library reports it
__all__ = [
    "Engine", "Buffer", "Region", "Request", "PreparedList", "State", "Notification", "Outcome", "PeerInfo", "RegionInfo",
    "ClusterPeer", "Connecting", "Metrics", "Metric", "MetricSample",
    "XferError", "InvalidArgumentError", "NotConnectedError",
    "AlreadyConnectedError", "UnsupportedError", "ResourceExhaustedError",
    "RemoteAccessDeniedError", "ConnectionLostError", "CanceledError", "InternalError",
    "DataCorruptedError", "option_names", "transports", "TransportState",
]

_xfer._set_error_classes(_errors.BY_CODE)


async def _wait_in_asyncio(request):
    try:
        return await _asyncio.get_running_loop().run_in_executor(None, request.wait)
    except _asyncio.CancelledError:
        request.cancel()  # the task was canceled: so is the request (and the executor's wait ends)
        raise


def _await_request(self):
    """Waits for the request in asyncio (on the loop's default executor); returns True once it
    completed, raises its error otherwise. Canceling the awaiting task cancels the request."""
    return _wait_in_asyncio(self).__await__()


Request.__await__ = _await_request


def _cluster_name(name):
    """A name as a cluster name (xfer.mooncake's segments, xfer.nixl's agents): its letters,
    digits, '.', '_' and '-' as they are, anything else (':' of host:port) as '_'."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)[:128] or "_"


class Connecting:
    """A connect under way (Engine.connect_async). done() polls it; wait() returns once it
    connected and raises its error (e.g. xfer.AlreadyConnectedError) once it failed."""

    def __init__(self, engine, peer, handle):
        self.peer = peer
        self._engine, self._handle = engine, handle
        self._ended, self._error = False, None
        self._lock = threading.Lock()  # (polled from several threads: the engine reports the end once)

    def done(self):
        with self._lock:
            if not self._ended:
                try:
                    self._ended = self._engine._connect_poll(self._handle)
                except XferError as e:
                    self._ended, self._error = True, e
            return self._ended

    def wait(self, timeout=None):
        """Waits (polling every millisecond) until it ended; xfer.TimeoutError when it has not
        within timeout seconds (it goes on)."""
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self.done():
            if deadline is not None and _time.monotonic() >= deadline:
                raise TimeoutError(f"connect_async to {self.peer!r} has not ended yet")
            _time.sleep(0.001)
        if self._error is not None:
            raise self._error

    def __repr__(self):
        state = "connecting" if not self._ended else ("failed" if self._error else "connected")
        return f"<xfer.Connecting {self.peer} {state}>"


class Engine(_xfer.Engine):
    """A transfer engine.

    Engine(name, **options): name is "host:port" to listen ("127.0.0.1:0" picks a free port;
    see .name), or a host alone for an engine that only initiates. options: timeout (seconds,
    for calls given none; default 30) and the engine options of docs/options.md by flat name,
    e.g. transport="tcp", tcp_links=4, ucx_mode="on", heartbeat_timeout=3.0 (xfer.option_names()
    lists them). A context manager: leaving the block closes the engine.

    Every call that can block releases the GIL: many Python threads may transfer at once.
    (xfer.TimeoutError is left out of `from xfer import *`: it would hide the builtin.)
    """

    def __init__(self, name, **options):
        super().__init__(name, **options)
        # handle -> the Regions registered under it (the same range registered twice has one
        # handle, and stays registered until each Region is deregistered).
        self._regions = {}

    def connect_async(self, peer, timeout=None):
        """Starts connect(peer, timeout) on the engine's connect threads and returns a Connecting
        at once: one thread can so connect to many peers together."""
        return Connecting(self, peer, self._connect_async(peer, timeout))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        try:  # an exception is on its way: do not replace it with close()'s refusal
            self.close()
        except BufferError:
            pass  # views of alloc() memory are alive: the engine closes once they are gone

    def __repr__(self):
        return f"<xfer.Engine {self.name}{' closed' if self.closed else ''}>"

    def close(self):
        """Says goodbye to peers, fails requests still running (CANCELED) and frees what alloc()
        gave. Waits for calls in other threads to return. Refused (BufferError) while views of
        alloc() buffers are alive. Closing twice is fine."""
        super().close()
        self._regions.clear()

    def register(self, memory, tag="", read_only=False):
        """Registers memory so that peers may READ it, and WRITE it unless read_only; returns
        a Region.

        memory: a numpy array or anything with the buffer protocol (writable, contiguous), an
        object with __cuda_array_interface__ or __array_interface__, a torch tensor (CPU or
        CUDA; torch is not imported), or an (addr, len, kind) tuple with kind "host" or "cuda".
        read_only: peers may READ it but their WRITEs fail (xfer.RemoteAccessDeniedError).
        The engine keeps the object alive until deregister(region)."""
        if isinstance(memory, Buffer):  # registered already: by range, so that no view is held
            addr, length, kind, via_buffer = memory.addr, memory.len, memory.kind, False
        else:
            addr, length, kind, via_buffer = _memory.resolve(memory)
        if via_buffer:
            region = self._register_buffer(memory, tag, read_only)
        else:
            region = self._register_range(addr, length, kind, tag, read_only, memory)
        self._regions.setdefault(region.handle, []).append(region)
        return region

    def deregister(self, region):
        """Waits until connected peers stopped using the region, then forgets it. Memory
        registered twice stays registered until both Regions are deregistered."""
        handle = region.handle
        region.deregister()
        same = self._regions.get(handle, [])
        if region in same:
            same.remove(region)
        if not same:
            self._regions.pop(handle, None)

    def alloc(self, size, kind="host", tag="", huge_pages=False, device=-1, read_only=False):
        """Allocates size bytes (zeroed) and registers them; returns a Buffer.

        Host memory is shared with same-host peers, which then move it with memcpy (no system
        call per transfer); numpy.asarray(buf) or numpy.frombuffer(buf, dtype) view it without
        a copy. kind="cuda": GPU memory on device (-1: the current one). huge_pages: back it
        with huge pages where the kernel has them. read_only: peers may READ it but not WRITE
        it (this process still writes it)."""
        return self._alloc(size, _memory._kind(kind), tag, huge_pages, device, read_only)
