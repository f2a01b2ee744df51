"""The Mooncake Transfer Engine's Python API (mooncake.engine.TransferEngine) on xfer.

Code written for Mooncake runs on xfer by changing one import::

    from xfer.mooncake import TransferEngine      # was: from mooncake.engine import TransferEngine

Methods keep Mooncake's names, signatures and return conventions: 0 or a negative int for
success or failure, batch ids, transfer_check_status's 1/0/-1/-2. Failures are logged (logger
"xfer.mooncake") with the engine's reason, never raised, as Mooncake does. Segment names are
the peers' "host:port", as in Mooncake's P2P handshake mode, or, with a metadata server (etcd,
or an HTTP metadata server such as Mooncake's), the local_hostname each engine was initialized
with. docs/python.md lists what is not covered
and where xfer is stricter.
"""

import bisect
import ctypes
import enum
import itertools
import logging
import os
import threading

from . import AlreadyConnectedError, Engine, NotConnectedError, XferError, _cluster_name

log = logging.getLogger("xfer.mooncake")

POOL_ENV = "XFER_MOONCAKE_POOL_BYTES"
TRANSPORT_ENV = "XFER_MOONCAKE_TRANSPORT"  # forces one xfer transport, e.g. "tcp"
DEFAULT_POOL_BYTES = 256 << 20
_MANAGED_TAG = "mooncake-managed"
_ALIGN = 64
_NOTIFY_MAGIC = b"xfer-mc\0"  # a notification that carries Mooncake's TransferNotify.name
_NOTIFY_BYTES = 1 << 20  # the engine's bound on one, framed (notify_max_message_bytes)
# Mooncake's error codes (its error.h) where its Python API returns them.
ERR_INVALID_ARGUMENT = -1
ERR_SOCKET = -102
ERR_METADATA = -200


class TransferOpcode(enum.IntEnum):
    """READ/WRITE (Mooncake's module spells them Read and Write: both work)."""

    READ = 0
    WRITE = 1
    Read = 0
    Write = 1


class TransferNotify:
    """A notification: name (chosen by the sender) and msg."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


class _Arena:
    """First-fit allocator over one registered buffer, with coalescing frees."""

    def __init__(self, addr, size):
        self.addr, self.size = addr, size
        self._free = [(addr, size)]  # sorted by address
        self._used = {}              # addr -> size
        self._lock = threading.Lock()

    def allocate(self, n):
        """An address of n bytes (64-byte aligned), or 0 when no free block is that long."""
        n = (max(n, 1) + _ALIGN - 1) // _ALIGN * _ALIGN
        with self._lock:
            for i, (a, s) in enumerate(self._free):
                if s >= n:
                    if s == n:
                        del self._free[i]
                    else:
                        self._free[i] = (a + n, s - n)
                    self._used[a] = n
                    return a
        return 0

    def free(self, addr):
        """True when addr was allocated here (and is now free)."""
        with self._lock:
            n = self._used.pop(addr, None)
            if n is None:
                return False
            i = bisect.bisect(self._free, (addr, 0))
            self._free.insert(i, (addr, n))
            for j in (i, i - 1):  # merge with the next block, then with the previous one
                if 0 <= j < len(self._free) - 1:
                    (a, s), (b, t) = self._free[j], self._free[j + 1]
                    if a + s == b:
                        self._free[j:j + 2] = [(a, s + t)]
            return True


_FAILURES = (XferError, ValueError, TypeError, OverflowError, BufferError)


def _ok(what, fn, *args, **kwargs):
    """0 when fn succeeds; logs the reason and returns -1 when it fails."""
    try:
        fn(*args, **kwargs)
        return 0
    except _FAILURES as e:
        log.warning("%s failed: %s", what, e)
        return -1


def _split_host_port(name):
    """("host", "port" or "") of "host", "host:port", "[v6]", "[v6]:port" or a bare v6 address;
    the host of a v6 address comes back in brackets."""
    if name.startswith("["):
        host, _, rest = name.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else ""
    if name.count(":") > 1:
        return f"[{name}]", ""
    host, _, port = name.partition(":")
    return host, port


class TransferEngine:
    """Mooncake's TransferEngine, on xfer. Call initialize() first."""

    def __init__(self):
        self._engine = None
        self._pool = None      # the managed pool: an xfer.Buffer cut by _Arena
        self._arena = None
        self._large = {}       # addr -> Buffer: managed buffers larger than the pool had free
        self._regions = {}     # addr -> Region: register_memory
        self._batches = {}     # batch id -> xfer.Request
        self._batch_ids = itertools.count(1)
        self._timeout = None   # seconds (MC_TRANSFER_TIMEOUT), before the per-byte allowance
        self._hostname = None  # local_hostname: this engine's segment name
        self._named = False    # a metadata server: segment names are published cluster names

    # ---- set-up

    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Starts the engine on local_hostname ("host" or "host:port"). As in Mooncake's P2P
        handshake mode the engine picks its own port (get_rpc_port()) unless the environment
        sets MC_LEGACY_RPC_PORT_BINDING. Also allocates and registers the managed pool
        (XFER_MOONCAKE_POOL_BYTES, default 256 MiB). Returns 0, or -1 with a logged reason."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type=""):
        if self._engine is not None:
            log.warning("initialize: this TransferEngine is already initialized")
            return -1
        # (Notifications up to 1 MiB, name and message together, as xfer.nixl takes: the
        # engine's default of 4 KiB would refuse metadata that Mooncake code attaches.)
        options = {"auto_connect": True, "notify_max_message_bytes": _NOTIFY_BYTES}
        if metadata_server != "P2PHANDSHAKE":
            url = _metadata_url(metadata_server, metadata_type)
            if url is None:
                log.warning("initialize: metadata server %r is not supported: use \"P2PHANDSHAKE\" "
                            "(peers are named host:port), etcd (\"etcd://host:port\") or an HTTP "
                            "metadata server (\"http://host:port/metadata\")", metadata_server)
                return -1
            options.update(metadata=url, cluster_name=_cluster_name(local_hostname))
        if protocol == "tcp":
            options["ucx_mode"] = "off"
        elif protocol == "rdma":
            options["ucx_mode"] = "on"
        else:
            log.warning("initialize: protocol %r is not supported (\"tcp\" or \"rdma\")", protocol)
            return -1
        if os.environ.get(TRANSPORT_ENV):
            options["transport"] = os.environ[TRANSPORT_ENV]
        host, port = _split_host_port(local_hostname)
        if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING") or not port:
            port = "0"
        try:
            self._timeout = float(os.environ.get("MC_TRANSFER_TIMEOUT") or 30)
            pool_bytes = int(os.environ.get(POOL_ENV, DEFAULT_POOL_BYTES))
            self._engine = Engine(f"{host}:{port}", **options)
            self._pool = self._engine.alloc(pool_bytes, tag=_MANAGED_TAG)
        except _FAILURES as e:
            log.warning("initialize(%r) failed: %s", local_hostname, e)
            self.close()
            return -1
        self._arena = _Arena(self._pool.addr, self._pool.len)
        self._hostname = local_hostname
        self._named = "metadata" in options
        return 0

    def _peer(self, segment_name):
        """The engine to reach for a segment name: with a metadata server, the engine published under it
        (this one for its own name); else the name itself, host:port."""
        if not self._named:
            return segment_name
        return self._engine.name if segment_name == self._hostname else _cluster_name(segment_name)

    def get_rpc_port(self):
        """The port peers reach this engine on (its segment name is host:port)."""
        return int(self._engine.name.rpartition(":")[2]) if self._engine else -1

    def close(self):
        """Closes the engine (not in Mooncake's API: its engine lives as long as the process)."""
        if self._engine is not None:
            self._batches.clear()
            self._engine.close()
        self._engine = self._pool = self._arena = None
        self._large.clear()
        self._regions.clear()

    def _ready(self, what):
        if self._engine is None:
            log.warning("%s: call initialize() first", what)
            return False
        return True

    # ---- memory

    def allocate_managed_buffer(self, length):
        """An address in registered memory of at least length bytes, or 0."""
        if not self._ready("allocate_managed_buffer"):
            return 0
        addr = self._arena.allocate(length)
        if addr:
            return addr
        try:  # more than the pool has free: a registered buffer of its own
            buf = self._engine.alloc(length, tag=_MANAGED_TAG)
        except _FAILURES as e:
            log.warning("allocate_managed_buffer(%d) failed: %s", length, e)
            return 0
        self._large[buf.addr] = buf
        return buf.addr

    def free_managed_buffer(self, buffer_addr, length):
        if self._arena is not None and self._arena.free(buffer_addr):
            return 0
        buf = self._large.pop(buffer_addr, None)
        if buf is None:
            log.warning("free_managed_buffer: 0x%x is not a managed buffer", buffer_addr)
            return -1
        return _ok("free_managed_buffer", buf.free)

    def get_first_buffer_address(self, segment_name):
        """The address of the segment's managed pool (its first registered buffer), or 0."""
        if not self._ready("get_first_buffer_address"):
            return 0
        if self._is_local(segment_name):
            return self._pool.addr
        try:
            regions = self._engine.remote_regions(self._peer(segment_name))
        except XferError as e:
            log.warning("get_first_buffer_address(%r) failed: %s", segment_name, e)
            return 0
        managed = [r for r in regions if r.tag == _MANAGED_TAG]
        return (managed or regions)[0].addr if regions else 0

    def _is_local(self, segment_name):
        return segment_name in (self._engine.name, self._hostname)

    def register_memory(self, buffer_addr, capacity, location="*"):
        """Registers [buffer_addr, +capacity); location "cuda:N" for GPU memory."""
        if not self._ready("register_memory"):
            return -1
        if buffer_addr in self._regions:
            log.warning("register_memory: 0x%x is already registered", buffer_addr)
            return -1
        kind = "cuda" if str(location).startswith("cuda") else "host"
        try:
            self._regions[buffer_addr] = self._engine.register((buffer_addr, capacity, kind))
            return 0
        except _FAILURES as e:
            log.warning("register_memory(0x%x, %d) failed: %s", buffer_addr, capacity, e)
            return -1

    def unregister_memory(self, buffer_addr):
        region = self._regions.pop(buffer_addr, None)
        if region is None:
            log.warning("unregister_memory: 0x%x was not registered", buffer_addr)
            return -1
        return _ok("unregister_memory", self._engine.deregister, region)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        if len(buffer_addresses) != len(capacities):
            log.warning("batch_register_memory: %d addresses, %d capacities",
                        len(buffer_addresses), len(capacities))
            return -1
        rc = 0
        for a, n in zip(buffer_addresses, capacities):
            rc = self.register_memory(a, n, location) or rc
        return rc

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for a in buffer_addresses:
            rc = self.unregister_memory(a) or rc
        return rc

    def _local_range_ok(self, addr, length):
        if not isinstance(length, int) or length < 0:
            return False

        def inside(base, size):
            return base <= addr and addr + length <= base + size
        return ((self._pool is not None and inside(self._pool.addr, self._pool.len))
                or any(inside(b.addr, b.len) for b in self._large.values())
                or any(inside(r.addr, r.len) for r in self._regions.values()))

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies length bytes of src_ptr (bytes) to dest_address, which must lie in this
        engine's registered memory (xfer is stricter than Mooncake here)."""
        if length > len(src_ptr) or not self._local_range_ok(dest_address, length):
            log.warning("write_bytes_to_buffer: [0x%x, +%d) is not inside this engine's "
                        "registered memory, or the data is shorter", dest_address, length)
            return -1
        ctypes.memmove(dest_address, src_ptr, length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        """length bytes at source_address (in this engine's registered memory) as bytes."""
        if not self._local_range_ok(source_address, length):
            raise ValueError(f"read_bytes_from_buffer: [0x{source_address:x}, +{length}) is not "
                             "inside this engine's registered memory")
        return ctypes.string_at(source_address, length)

    # ---- transfers

    def _move(self, what, opcode, target, buffers, peers, lengths, notify=None):
        if not self._ready(what):
            return -1
        if not len(buffers) == len(peers) == len(lengths):
            log.warning("%s: %d buffers, %d peer addresses, %d lengths", what, len(buffers),
                        len(peers), len(lengths))
            return -1
        move = self._engine.write if TransferOpcode(opcode) == TransferOpcode.WRITE else self._engine.read
        return _ok(f"{what} to {target!r}", move, self._peer(target), local=buffers, remote=peers,
                   length=lengths, notify=_encode_notify(notify), timeout=self._timeout_for(lengths))

    def _timeout_for(self, lengths):
        # As Mooncake: MC_TRANSFER_TIMEOUT (default 30 s) plus 1 ns per byte.
        return self._timeout + sum(lengths) * 1e-9

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self._move("transfer_sync_write", TransferOpcode.WRITE, target_hostname, [buffer],
                          [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self._move("transfer_sync_read", TransferOpcode.READ, target_hostname, [buffer],
                          [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        return self._move("transfer_sync", opcode, target_hostname, [buffer],
                          [peer_buffer_address], [length], notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        return self._move("batch_transfer_sync_write", TransferOpcode.WRITE, target_hostname,
                          buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                 transport_hint=""):
        return self._move("batch_transfer_sync_read", TransferOpcode.READ, target_hostname,
                          buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                            notify=None, transport_hint=""):
        return self._move("batch_transfer_sync", opcode, target_hostname, buffers,
                          peer_buffer_addresses, lengths, notify)

    def _submit(self, what, opcode, target, buffers, peers, lengths):
        """A batch id (> 0), or 0 when the request could not start."""
        if not self._ready(what):
            return 0
        start = (self._engine.write_async if TransferOpcode(opcode) == TransferOpcode.WRITE
                 else self._engine.read_async)
        try:
            request = start(self._peer(target), local=buffers, remote=peers, length=lengths,
                            timeout=self._timeout_for(lengths))
        except _FAILURES as e:
            log.warning("%s to %r failed: %s", what, target, e)
            return 0
        batch = next(self._batch_ids)
        self._batches[batch] = request
        return batch

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                   transport_hint=""):
        return self._submit("batch_transfer_async_write", TransferOpcode.WRITE, target_hostname,
                            buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        return self._submit("batch_transfer_async_read", TransferOpcode.READ, target_hostname,
                            buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        return self._submit("batch_transfer_async", opcode, target_hostname, buffers,
                            peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """A batch id (> 0) for transfer_check_status, or 0 (as Mooncake: its batch ids are
        unsigned, and 0 is their failure sentinel)."""
        return self._submit("transfer_submit_write", TransferOpcode.WRITE, target_hostname,
                            [buffer], [peer_buffer_address], [length])

    def get_batch_transfer_status(self, batch_ids):
        """Waits for the batches to end and releases them: 0 when all completed, -1 if any
        failed (or is not a batch id)."""
        rc = 0
        for batch in batch_ids:
            request = self._batches.pop(batch, None)
            if request is None:
                log.warning("get_batch_transfer_status: %r is not a running batch", batch)
                rc = -1
                continue
            try:
                request.wait()
            except XferError as e:
                log.warning("batch %d failed: %s", batch, e)
                rc = -1
        return rc

    def transfer_check_status(self, batch_id):
        """1 completed, 0 still running, -1 failed, -2 timed out; the batch is released once
        it reported an end."""
        request = self._batches.get(batch_id)
        if request is None:
            log.warning("transfer_check_status: %r is not a running batch", batch_id)
            return -1
        state = request.status().name
        if state == "WAITING":
            return 0
        del self._batches[batch_id]
        if state == "COMPLETED":
            return 1
        try:
            request.wait()
        except XferError as e:
            log.warning("batch %d failed: %s", batch_id, e)
        return -2 if state == "TIMEOUT" else -1

    def send_probe(self, peer_server_name):
        """0 when the peer's engine answers (connected now, or already); else Mooncake's code:
        ERR_METADATA (-200) for a name the metadata server does not know, ERR_SOCKET (-102)
        for a peer that cannot be reached."""
        if not self._ready("send_probe"):
            return ERR_INVALID_ARGUMENT
        try:
            self._engine.connect(self._peer(peer_server_name), timeout=self._timeout)
            return 0
        except AlreadyConnectedError:
            pass  # (a session, or a connect under way: the peer answered only if it is up)
        except _FAILURES as e:
            log.warning("send_probe(%r) failed: %s", peer_server_name, e)
            # (The engine's words for a name its metadata service does not hold: ERR_METADATA.)
            unknown = self._named and isinstance(e, NotConnectedError) and "no engine named" in str(e)
            return ERR_METADATA if unknown else ERR_SOCKET
        try:  # a live session: its heartbeats would have ended it if the peer were gone
            self._engine.peer_info(self._peer(peer_server_name))
            return 0
        except XferError as e:
            log.warning("send_probe(%r): no session yet: %s", peer_server_name, e)
            return ERR_SOCKET

    # ---- notifications

    def get_notifies(self):
        """The notifications received since the last call, as TransferNotify(name, msg)."""
        if not self._ready("get_notifies"):
            return []
        out = []
        for n in self._engine.get_notifies():
            name, msg = n.sender, n.message
            if msg.startswith(_NOTIFY_MAGIC):  # from an xfer.mooncake sender: its own name
                name, _, msg = msg[len(_NOTIFY_MAGIC):].partition(b"\0")
                name = name.decode("utf-8", "surrogateescape")
            out.append(TransferNotify(name, msg.decode("utf-8", "surrogateescape")))
        return out


def _metadata_url(metadata_server, metadata_type=""):
    """xfer's metadata URL for a Mooncake metadata server: "etcd://host:port[,...]" and an HTTP
    metadata server's "http://host:port/path" as they are; a bare "host:port" as etcd, as
    Mooncake reads it (or metadata_type "etcd"); None for others (redis://)."""
    scheme = metadata_server.partition("://")[0] if "://" in metadata_server else ""
    if scheme in ("http", "https") and metadata_type in ("", "http"):
        return metadata_server
    if scheme == "etcd" and metadata_type in ("", "etcd"):
        return metadata_server
    if scheme or metadata_type not in ("", "etcd") or not metadata_server:
        return None
    return "etcd://" + metadata_server


def _encode_notify(notify):
    if notify is None:
        return None
    return _NOTIFY_MAGIC + _utf8(notify.name) + b"\0" + _utf8(notify.msg)


def _utf8(text):
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
