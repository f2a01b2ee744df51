"""NIXL's nixl._api (nixl_agent, nixl_agent_config) on xfer. See xfer/nixl/__init__.py."""

import atexit
import logging
import os
import re
import threading
import time
import weakref

import numpy as np

from .. import Engine, XferError, _cluster_name
from .. import _errors
from . import _bindings as nb
from ._bindings import (DEFAULT_COMM_PORT, nixl_thread_sync_t, nixlRegDList,  # noqa: F401
                        nixlXferDList, nixlXferTelemetry)
from ._wire import Agents, FailedNotif, Message, host_address  # noqa: F401

log = logging.getLogger("xfer.nixl")

HOST_ENV = "XFER_NIXL_HOST"            # the address this process's agents listen on
TRANSPORT_ENV = "XFER_NIXL_TRANSPORT"  # forces one xfer transport, e.g. "tcp"
OUTCOMES_ENV = "XFER_NIXL_NOTIFY_OUTCOMES"  # "1": failed transfers' notifications too
SECRET_ENV = "XFER_SECRET_FILE"        # a shared secret: peers must prove they know it
ETCD_ENV = "NIXL_ETCD_ENDPOINTS"       # NIXL's metadata server: etcd (http://host:port[,...])
ETCD_NAMESPACE_ENV = "NIXL_ETCD_NAMESPACE"
_FETCH_RETRY = 0.1                     # seconds between lookups of an agent not in etcd yet
_MEMS = {"DRAM": nb.DRAM_SEG, "VRAM": nb.VRAM_SEG, "cpu": nb.DRAM_SEG, "cuda": nb.VRAM_SEG}
_KIND = {nb.DRAM_SEG: "host", nb.VRAM_SEG: "cuda"}
_OPS = ("READ", "WRITE")
_PLUGINS = ["UCX", "XFER"]  # backend names taken; xfer picks its transport per peer either way
_NOTIFY_BYTES = 1 << 20     # notifications up to 1 MiB (NIXL code sends descriptor lists in them)
_RELEASE_WAIT = 10.0        # seconds release_xfer_handle waits for a canceled transfer to stop


_live = weakref.WeakSet()  # agents not closed yet: closed at exit, before the interpreter goes


@atexit.register
def _close_all():
    for agent in list(_live):
        agent.close()


class nixl_agent_config:
    """NIXL's agent options. enable_listen_thread: the agent listens on listen_port (0: a free
    port) for the metadata exchange (send_local_metadata, fetch_remote_metadata); otherwise
    on a free port. The progress thread is always on. backends: names only (see get_plugin_list).
    Unknown keywords (sync_mode...) are accepted and ignored."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=None, **ignored):
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = ["UCX"] if backends is None else list(backends)


def _name(agent):
    return agent.decode() if isinstance(agent, (bytes, bytearray)) else str(agent)


_NIXL_ERRORS = ((_errors.ConnectionLostError, nb.nixlRemoteDisconnectError),
                (_errors.NotConnectedError, nb.nixlRemoteDisconnectError),
                (_errors.CanceledError, nb.nixlCancelledError),
                (_errors.InvalidArgumentError, nb.nixlInvalidParamError),
                (_errors.RemoteAccessDeniedError, nb.nixlNotAllowedError),
                (_errors.UnsupportedError, nb.nixlNotSupportedError))


def _raise_nixl(e):
    """The nixl exception for an xfer error (nixlBackendError for the others)."""
    for xfer_type, nixl_type in _NIXL_ERRORS:
        if isinstance(e, xfer_type):
            raise nixl_type(str(e)) from e
    raise nb.nixlBackendError(str(e)) from e


class _Handle:
    """A handle NIXL code keeps opaque: truthy, released once (release is idempotent)."""

    def __init__(self):
        self.released = False
        self.lock = threading.Lock()

    def __bool__(self):
        return True


class _Prepped(_Handle):
    """prep_xfer_dlist's handle: one side's descriptors (peer: None for local memory), and the
    engine's prepared list of them, made at the first make_prepped_xfer that uses it."""

    def __init__(self, peer, rows):
        super().__init__()
        self.peer, self.rows = peer, rows
        self._list = None     # the engine's list; False: it cannot be prepared (tried once)
        self._engine = None   # the engine it was prepared by

    def engine_list(self, engine):
        """The engine's prepared list of the rows (xfer.PreparedList), or None where the
        engine cannot prepare it (no rows; descriptors outside registered memory; a peer not
        connected yet, tried again next time; a list of another agent's engine): the transfers
        then take the plain path, which says why they fail, if they do."""
        with self.lock:
            if self._list is None and len(self.rows) and not self.released:
                addr, length = self.rows[:, 0], self.rows[:, 1]
                try:
                    self._list = (engine.prepare_local(addr, length) if self.peer is None
                                  else engine.prepare_remote(self.peer, addr, length))
                    self._engine = engine
                except (_errors.NotConnectedError, _errors.ConnectionLostError) as e:
                    log.debug("xfer.nixl: the descriptor list is not prepared yet (%s)", e)
                except XferError as e:
                    log.debug("xfer.nixl: the descriptor list is not prepared (%s); plain transfers", e)
                    self._list = False
            return self._list if self._list and self._engine is engine else None

    def forget_list(self, stale=None):
        """Drops the engine's list (stale: only when it is that one, whose session ended).
        Handles made from it keep their own reference."""
        with self.lock:
            if stale is None or self._list is stale:
                self._list = self._engine = None


class _Xfer(_Handle):
    """A transfer: its descriptors, and the request of its last posting."""

    def __init__(self, op, peer, local, remote, lengths, notif):
        super().__init__()
        self.op, self.peer, self.notif = op, peer, notif
        self.local, self.remote, self.lengths = local, remote, lengths
        self.prepared = None  # (local _Prepped, its list, indices, remote _Prepped, its list, indices)
        self.request = None
        self.start = self.posted = self.ended = 0.0


class nixl_agent:
    """NIXL's agent on an xfer engine. agent_name: unique among the agents that meet."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None:
            instantiate_all = False  # (as NIXL: the config's backends win)
        conf = nixl_conf or nixl_agent_config()
        self.name = _name(agent_name)
        self._telemetry = conf.capture_telemetry
        port = conf.port if conf.enable_listen else 0
        # XFER_NIXL_NOTIFY_OUTCOMES=1: transfers toward this agent that do not complete are told
        # here too (get_failed_notifs, check_remote_xfer_state), at a cost per notified transfer.
        options = {"notify_max_message_bytes": _NOTIFY_BYTES,
                   "notify_outcomes": os.environ.get(OUTCOMES_ENV, "0") == "1"}
        if os.environ.get(SECRET_ENV):
            options["secret_file"] = os.environ[SECRET_ENV]
        if os.environ.get(TRANSPORT_ENV):
            options["transport"] = os.environ[TRANSPORT_ENV]
        self._etcd = _etcd_url()
        if self._etcd:  # (the agent is published under its name from now on)
            options.update(metadata=self._etcd, cluster_name=_cluster_name(self.name))
        self._fetching = {}  # agent name -> _Fetch: etcd lookups under way (_fetch_lock)
        self._fetch_lock = threading.Lock()
        host = self._host = os.environ.get(HOST_ENV) or host_address()
        try:
            self._engine = Engine(f"{host}:{port}", **options)
        except XferError as e:
            _raise_nixl(e)
        self._agents = Agents(self._engine, self.name)
        self.plugin_list = list(_PLUGINS)
        self.backends = {}
        for b in (self.plugin_list if instantiate_all else conf.backends):
            if b in self.plugin_list:
                self.create_backend(b)
            else:
                log.warning("xfer.nixl agent %s: skipping backend %s (xfer.nixl offers %s)",
                            self.name, b, self.plugin_list)
        log.info("xfer.nixl agent %s listens at %s", self.name, self._engine.name)
        self.notifs = {}
        self._failed = {}   # agent name -> [FailedNotif] taken from the engine, not by the caller yet
        self._regions = {}  # (addr, len, dev) -> [xfer Region]
        self._rates = {}    # peer address -> bytes/s of the last completed transfer (estimate_xfer_cost)
        self._lock = threading.Lock()
        _live.add(self)

    def __del__(self):
        self.close()

    def close(self):
        """Stops the agent: its thread, then its engine (not in NIXL: its agents end when
        collected, which this also does)."""
        agents = getattr(self, "_agents", None)
        if agents is not None:
            agents.stop()
            self._engine.close()
            self._agents = None

    # ------------------------------------------------------------ backends
    def get_plugin_list(self):
        return list(self.plugin_list)

    def create_backend(self, backend, initParams=None):
        """Takes any name in get_plugin_list(): xfer chooses its transport per peer (shm, cma,
        tcp, ucx, cuda) whatever the name; said once in the log."""
        if backend not in self.plugin_list:
            raise nb.nixlNotFoundError(f"no backend {backend!r} (xfer.nixl offers {self.plugin_list})")
        if not self.backends:
            log.info("xfer.nixl agent %s: backend %s asked for; xfer picks its best transport "
                     "for each peer", self.name, backend)
        self.backends[backend] = len(self.backends)

    def get_plugin_mem_types(self, backend):
        return ["DRAM", "VRAM"] if backend in self.plugin_list else []

    def get_backend_mem_types(self, backend):
        return ["DRAM_SEG", "VRAM_SEG"] if backend in self.backends else []

    def get_plugin_params(self, backend):
        return {}

    get_backend_params = get_plugin_params

    # ------------------------------------------------------------ descriptors
    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        return self._descs(descs, mem_type, nixlRegDList)

    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        return self._descs(descs, mem_type, nixlXferDList)

    def _descs(self, descs, mem_type, cls):
        """NIXL's reading of descs (None, with a log line, when it cannot be read)."""
        if isinstance(descs, (nixlRegDList, nixlXferDList)):
            if isinstance(descs, cls):
                return descs
            if cls is nixlXferDList:  # (NIXL refuses this one; trimming is what was meant)
                return descs.trim()
            log.error("an nixlXferDList cannot be read as registration descriptors")
            return None
        tensors = _tensors(descs)
        if tensors is not None:
            if not tensors or any(t.device != tensors[0].device or not t.is_contiguous() for t in tensors):
                log.error("tensors must be contiguous and on one device")
                return None
            dev = tensors[0].get_device()
            rows = np.array([(t.data_ptr(), t.numel() * t.element_size(), max(dev, 0)) for t in tensors],
                            np.uint64)
            return cls(nb.DRAM_SEG if dev < 0 else nb.VRAM_SEG, rows)
        if mem_type not in _MEMS:
            log.error("memory type %r: give \"DRAM\" or \"VRAM\"", mem_type)
            return None
        try:
            if isinstance(descs, np.ndarray):
                return cls(_MEMS[mem_type], descs)
            if cls is nixlRegDList:
                return cls(_MEMS[mem_type], [tuple(d) for d in descs])
            return cls(_MEMS[mem_type], [tuple(d)[:3] for d in descs])
        except (ValueError, TypeError, OverflowError) as e:
            log.error("cannot read the descriptors: %s", e)
            return None

    def get_serialized_descs(self, descs):
        import pickle
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized):
        import pickle
        return pickle.loads(serialized)

    # ------------------------------------------------------------ memory
    def register_memory(self, reg_list, mem_type=None, is_sorted=False, backends=None):
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nb.nixlInvalidParamError("register_memory: the descriptors cannot be read")
        kind = _KIND.get(descs.getType())
        if kind is None:
            raise nb.nixlNotSupportedError(f"register_memory: {descs.getType().name} memory")
        done = []
        try:
            for addr, length, dev, meta in descs:
                region = self._engine.register((addr, length, kind), tag=meta.decode(errors="replace"))
                done.append(((addr, length, dev), region))
        except XferError as e:
            for _, region in done:  # (all or nothing)
                try:
                    self._engine.deregister(region)
                except XferError as undo:
                    log.warning("xfer.nixl: register_memory could not undo a registration: %s", undo)
            _raise_nixl(e)
        with self._lock:
            for key, region in done:
                self._regions.setdefault(key, []).append(region)
        return descs

    def deregister_memory(self, dereg_list, backends=None):
        """All of the list or nothing: a descriptor not registered raises before any goes."""
        taken = []
        with self._lock:
            for addr, length, dev, _ in dereg_list:
                held = self._regions.get((addr, length, dev))
                if not held:
                    for key, region in taken:
                        self._regions[key].append(region)
                    raise nb.nixlNotFoundError(f"deregister_memory: ({addr:#x}, {length}) is not registered")
                taken.append(((addr, length, dev), held.pop()))
        for _, region in taken:
            try:
                self._engine.deregister(region)
            except XferError as e:
                _raise_nixl(e)

    # ------------------------------------------------------------ metadata
    def get_agent_metadata(self):
        return self._agents.metadata()

    def add_remote_agent(self, metadata):
        """Loads a peer's get_agent_metadata(); returns its name (bytes, as NIXL does)."""
        try:
            name = self._agents.load(metadata)
        except ValueError as e:
            raise nb.nixlInvalidParamError(str(e)) from None
        except XferError as e:
            _raise_nixl(e)
        return name.encode()

    def remove_remote_agent(self, agent):
        self._agents.forget(_name(agent))

    def get_listen_port(self):
        return int(self._engine.name.rsplit(":", 1)[1])

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """Sends this agent's metadata to the agent listening on ip_addr:port. Without ip_addr,
        to etcd (NIXL_ETCD_ENDPOINTS), where the agent is published from its creation on."""
        if not ip_addr and self._etcd:
            return
        self._listener_call("send_local_metadata", ip_addr, port, Message.METADATA)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """Asks the agent listening on ip_addr:port for its metadata (without ip_addr: looks it
        up in etcd until it is there); check_remote_metadata says when it came."""
        if not ip_addr and self._etcd:
            name = _name(remote_agent)
            with self._fetch_lock:
                if name not in self._fetching:  # (one lookup at a time per agent)
                    self._fetching[name] = _Fetch(self._engine, _cluster_name(name))
            return
        self._listener_call("fetch_remote_metadata", ip_addr, port, Message.ASK)

    def _fetched(self, name):
        """Moves an etcd lookup of that agent on: remembered once its engine is connected;
        looked up again, with back-off, while etcd does not list it (other failures are
        logged once)."""
        with self._fetch_lock:
            fetch = self._fetching.get(name)
            if fetch is None or not fetch.connecting.done():
                return
            try:
                fetch.connecting.wait(0)
            except _errors.AlreadyConnectedError:
                pass  # (connected, or a connect to it under way: peer_info below tells)
            except XferError as e:
                fetch.retry(e)
                return
            try:
                address = self._engine.peer_info(fetch.cluster_name).name
            except XferError as e:  # (another connect to it is still under way)
                fetch.retry(e)
                return
            del self._fetching[name]
        self._agents.remember(name, address)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """Tells the agent at ip_addr:port (every known one when none is given) to forget us;
        one that is gone already is not an error (a log line)."""
        if not ip_addr:
            self._agents.tell_all(Message.FORGET)
            return
        try:
            self._agents.tell(self._listener(ip_addr, port), Message.FORGET)
        except XferError as e:
            log.info("xfer.nixl: invalidate_local_metadata: %s:%s is gone (%s)", ip_addr, port, e)

    def _listener_call(self, what, ip_addr, port, kind):
        if not ip_addr:
            raise nb.nixlNotSupportedError(f"{what}: give ip_addr, or set {ETCD_ENV} for a metadata server")
        try:
            self._agents.tell(self._listener(ip_addr, port), kind)
        except XferError as e:
            _raise_nixl(e)

    def get_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=None):
        """The same bytes as get_agent_metadata: a peer that connects sees every region this
        agent registered (xfer has no per-peer subset of regions), so descs is not needed."""
        return self.get_agent_metadata()

    def send_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=None,
                                    ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """send_local_metadata (see get_partial_agent_metadata)."""
        if not ip_addr and self._etcd:
            return
        self._listener_call("send_partial_agent_metadata", ip_addr, port, Message.METADATA)

    def _listener(self, ip_addr, port):
        """The engine address of the agent NIXL code reaches at ip_addr:port. NIXL's listener
        takes every address of its host; an agent here listens on one (XFER_NIXL_HOST, or the
        default route's), so a loopback address (or this host's) names the agent of this host
        that listens on that port."""
        local = ip_addr in ("localhost", "::1", self._host) or ip_addr.startswith("127.")
        host = self._host if local else ip_addr
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def check_remote_metadata(self, agent, descs=None):
        """True once this agent has the agent's metadata and, when descs (an nixlXferDList) are
        given, the agent has registered memory that holds each of them."""
        self._fetched(_name(agent))
        address = self._agents.address(_name(agent))
        if address is None or descs is None or len(descs) == 0:
            return address is not None
        try:
            regions = self._engine.remote_regions(address)
        except XferError as e:
            log.info("xfer.nixl: check_remote_metadata: the regions of %s are not known: %s", _name(agent), e)
            return False
        return all(any(r.addr <= addr and addr + length <= r.addr + r.len for r in regions)
                   for addr, length, _ in descs._rows.tolist())

    def make_connection(self, remote_agent, backends=None):
        """Connects to the agent now (transfers connect on first use otherwise); nothing when
        already connected. nixlNotFoundError for an agent whose metadata is not loaded."""
        address = self._peer(_name(remote_agent))
        try:
            self._agents.connect(address)
        except XferError as e:
            _raise_nixl(e)

    def query_memory(self, reg_list, backend, mem_type=None):
        """As NIXL's memory backends (UCX): nixlNotSupportedError; only storage backends, which
        xfer.nixl does not have, answer it. ValueError for a backend this agent did not create."""
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends)}")
        raise nb.nixlNotSupportedError("query_memory: memory backends do not answer it (storage backends do; "
                                       "xfer.nixl has none)")

    # ------------------------------------------------------------ transfers
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, is_sorted=False, backends=None):
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nb.nixlInvalidParamError("prep_xfer_dlist: the descriptors cannot be read")
        name = _name(agent_name)
        peer = None if name in ("", "NIXL_INIT_AGENT") else self._peer(name)
        return _Prepped(peer, descs._rows)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=None, skip_desc_merge=False):
        if local_xfer_side.released or remote_xfer_side.released:
            raise nb.nixlInvalidParamError("make_prepped_xfer: a descriptor list handle was released")
        if local_xfer_side.peer is not None:
            raise nb.nixlInvalidParamError("make_prepped_xfer: the local side was prepared for an agent's "
                                           "memory (prep it with \"NIXL_INIT_AGENT\")")
        local_ids = _indices(local_indices, len(local_xfer_side.rows))
        remote_ids = _indices(remote_indices, len(remote_xfer_side.rows))
        local = local_xfer_side.rows[local_ids]
        remote = remote_xfer_side.rows[remote_ids]
        xfer = self._xfer(operation, local, remote, remote_xfer_side.peer, notif_msg)
        if len(local_ids) and remote_xfer_side.peer is not None:
            mine, theirs = (local_xfer_side.engine_list(self._engine),
                            remote_xfer_side.engine_list(self._engine))
            if mine is not None and theirs is not None:
                xfer.prepared = (local_xfer_side, mine, local_ids, remote_xfer_side, theirs, remote_ids)
        return xfer

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"",
                        backends=None):
        return self._xfer(operation, local_descs._rows, remote_descs._rows,
                          self._peer(_name(remote_agent)), notif_msg)

    def _xfer(self, op, local, remote, peer, notif):
        if op not in _OPS:
            raise KeyError(op)
        if peer is None:
            raise nb.nixlInvalidParamError("the remote side is this agent's local descriptors")
        if local.shape != remote.shape or not np.array_equal(local[:, 1], remote[:, 1]):
            raise nb.nixlInvalidParamError(f"local and remote descriptors differ in count or lengths "
                                           f"({len(local)} and {len(remote)})")
        return _Xfer(op, peer, local[:, 0].copy(), remote[:, 0].copy(), local[:, 1].copy(),
                     _bytes(notif))

    def _peer(self, name):
        if name == self.name:  # (loopback: NIXL lets an agent name itself as the remote side)
            return self._engine.name
        address = self._agents.address(name)
        if address is None:
            raise nb.nixlNotFoundError(f"no metadata of agent {name!r} (add_remote_agent first)")
        return address

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer; "DONE" when it completed at once, else "PROC" (failures raise)."""
        with handle.lock:
            return self._post(handle, notif_msg)

    def _post(self, handle, notif_msg):
        if handle.released:
            raise nb.nixlInvalidParamError("transfer: the handle was released")
        if handle.request is not None and not handle.request.done():
            raise nb.nixlRepostActiveError("transfer: the handle's last posting is still running")
        notif = _bytes(notif_msg) or handle.notif
        handle.start, handle.ended = time.time(), 0.0
        try:
            if len(handle.local) == 0:
                if notif:
                    self._agents.notify(handle.peer, notif)
                handle.request = None
                handle.posted = handle.ended = time.time()
                return "DONE"
            framed = self._agents.framed(notif) if notif else None
            handle.request = self._post_prepared(handle, framed) if handle.prepared else None
            if handle.request is None:
                move = self._engine.read_async if handle.op == "READ" else self._engine.write_async
                handle.request = move(handle.peer, local=handle.local, remote=handle.remote,
                                      length=handle.lengths, notify=framed)
        except XferError as e:
            _raise_nixl(e)
        handle.posted = time.time()
        return self.check_xfer_state(handle)

    def _post_prepared(self, handle, framed):
        """Posts a make_prepped_xfer handle over the engine's prepared lists: no descriptor is
        checked or looked up again, and a handle posted again reuses its plan (while it is
        among the last 8 posted over its remote list). None when the remote list's session has
        ended: the handle then takes the plain path from now on, which reaches the agent again
        once the agent layer has connected to it again."""
        local, mine, local_ids, remote, theirs, remote_ids = handle.prepared
        move = self._engine.read_prepared_async if handle.op == "READ" else self._engine.write_prepared_async
        try:
            return move(mine, local_ids, theirs, remote_ids, notify=framed)
        except _errors.ConnectionLostError:
            handle.prepared = None
            remote.forget_list(theirs)
            return None

    def check_xfer_state(self, handle):
        if handle.released:
            raise nb.nixlInvalidParamError("check_xfer_state: the handle was released")
        if handle.request is None:
            if handle.ended:
                return "DONE"
            raise nb.nixlNotPostedError("check_xfer_state: the transfer was never posted")
        try:
            if not handle.request.done():
                return "PROC"
            handle.request.wait(0)  # (raises its error)
        except XferError as e:
            _raise_nixl(e)
        if not handle.ended:
            handle.ended = time.time()
            if handle.ended > handle.start:
                self._rates[handle.peer] = handle.lengths.sum() / (handle.ended - handle.start)
        return "DONE"

    def get_xfer_telemetry(self, handle):
        if not self._telemetry:
            raise nb.nixlNoTelemetryError("get_xfer_telemetry: the agent's config has capture_telemetry off")
        us = lambda s: int(s * 1e6)  # noqa: E731
        return nixlXferTelemetry(startTime=us(handle.start), postDuration=us(handle.posted - handle.start),
                                 xferDuration=us(max(handle.ended - handle.start, 0.0)) if handle.ended else 0,
                                 totalBytes=int(handle.lengths.sum()), descCount=len(handle.lengths))

    def query_xfer_backend(self, handle):
        return "UCX"

    def estimate_xfer_cost(self, req_handle):
        """(duration us, error margin us, method): the handle's bytes at the rate of this agent's
        last completed transfer to the same agent (0 before one has completed); method
        "UNKNOWN": an observation, not a model (NIXL's UCX backend says "UNKNOWN" here too)."""
        rate = self._rates.get(req_handle.peer)
        duration = int(req_handle.lengths.sum() / rate * 1e6) if rate else 0
        return duration, 0, "UNKNOWN"

    def release_xfer_handle(self, handle):
        """Cancels the transfer if it is still running and waits until no byte of it moves any
        more (batches already started finish); then forgets the handle. A transfer that does
        not stop within 10 s raises nixlBackendError and keeps its handle, as in NIXL."""
        with handle.lock:
            if handle.released:
                return
            request = handle.request
            if request is not None and not request.done():
                request.cancel()
                try:
                    request.wait(_RELEASE_WAIT)
                except XferError:
                    pass  # (canceled, or failed: either way it stopped)
                if not request.done():
                    raise nb.nixlBackendError("release_xfer_handle: the transfer did not stop in time")
            handle.released = True

    def release_dlist_handle(self, handle):
        handle.released = True
        handle.forget_list()  # (the engine's list goes with the last handle made from it)

    # ------------------------------------------------------------ notifications
    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        try:
            self._agents.notify(self._peer(_name(remote_agent_name)), _bytes(notif_msg))
        except XferError as e:
            _raise_nixl(e)

    def get_new_notifs(self, backends=None):
        """{agent name: [message, ...]}: what came since the last call (or update_notifs)."""
        return self._agents.take_notifs()

    def update_notifs(self, backends=None):
        with self._lock:
            for name, msgs in self._agents.take_notifs().items():
                self.notifs.setdefault(name, []).extend(msgs)
            return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None, tag_is_prefix=True):
        """True once a notification from that agent starts with lookup_tag (or, tag_is_prefix
        False, contains it); that one message is taken."""
        self.update_notifs()
        with self._lock:
            msgs = self.notifs.get(_name(remote_agent_name), [])
            return _take_matching(msgs, lookup_tag, tag_is_prefix) is not None

    # xfer's addition: NIXL tells a target nothing of a transfer that failed.
    def get_failed_notifs(self):
        """{agent name: [FailedNotif(message, outcome, landed), ...]}: the transfers toward this
        agent that did not complete, since the last call. outcome: "FAILED", "TIMED_OUT",
        "CANCELED" or "INITIATOR_LOST" (the initiator's agent died or went away first); landed:
        the positions of the transfer's descriptors whose bytes all landed (none known for
        INITIATOR_LOST). Their messages never reach get_new_notifs."""
        with self._lock:
            self._collect_failed()
            got, self._failed = self._failed, {}
            return got

    def check_remote_xfer_state(self, remote_agent_name, lookup_tag, tag_is_prefix=True):
        """check_remote_xfer_done with check_xfer_state's answers: "DONE" once that agent's
        transfer with this notification completed, "ERR" once it ended otherwise (failed, timed
        out, canceled, its initiator lost), else "PROC". The notification found is taken."""
        self.update_notifs()
        name = _name(remote_agent_name)
        with self._lock:
            if _take_matching(self.notifs.get(name, []), lookup_tag, tag_is_prefix) is not None:
                return "DONE"
            self._collect_failed()
            mine = self._failed.get(name, [])
            i = _take_matching([f.message for f in mine], lookup_tag, tag_is_prefix)
            if i is not None:
                del mine[i]
                return "ERR"
        return "PROC"

    def _collect_failed(self):  # (self._lock held)
        for name, failed in self._agents.take_failed().items():
            self._failed.setdefault(name, []).extend(failed)


class _Fetch:
    """An etcd lookup of one agent (fetch_remote_metadata without an address): a connect by its
    cluster name, started again with back-off (0.1 s doubling to 1 s) while it fails."""

    def __init__(self, engine, cluster_name):
        self.engine, self.cluster_name = engine, cluster_name
        self.wait_s, self.logged = _FETCH_RETRY, False
        self.connecting, self.started = engine.connect_async(cluster_name, 10.0), time.monotonic()

    def retry(self, error):
        if time.monotonic() - self.started < self.wait_s:
            return
        if not isinstance(error, _errors.NotConnectedError) and not self.logged:
            log.warning("xfer.nixl: looking up agent %s in etcd: %s (still trying)", self.cluster_name, error)
            self.logged = True
        self.wait_s = min(self.wait_s * 2, 1.0)
        self.connecting, self.started = self.engine.connect_async(self.cluster_name, 10.0), time.monotonic()


def _etcd_url():
    """xfer's etcd:// URL for NIXL's NIXL_ETCD_ENDPOINTS ("http://host:port", several separated
    by ',' or ';') and NIXL_ETCD_NAMESPACE (default /nixl/agents); None when no endpoint is set."""
    endpoints = [e.strip() for e in re.split("[,;]", os.environ.get(ETCD_ENV, "")) if e.strip()]
    if not endpoints:
        return None
    if any(e.startswith("https://") for e in endpoints):
        raise nb.nixlNotSupportedError(f"{ETCD_ENV}: TLS (https) to etcd is not supported by xfer.nixl")
    hosts = ",".join(e.split("://", 1)[-1].rstrip("/") for e in endpoints)
    namespace = os.environ.get(ETCD_NAMESPACE_ENV, "/nixl/agents").strip("/")
    return f"etcd://{hosts}/{namespace}"


def _bytes(m):
    if m is None:
        return b""
    return m.encode() if isinstance(m, str) else bytes(m)


def _take_matching(messages, tag, tag_is_prefix):
    """The index of the first message that starts with tag (or contains it), removed from
    messages; None when none does."""
    tag = _bytes(tag)
    for i, m in enumerate(messages):
        if m.startswith(tag) if tag_is_prefix else tag in m:
            del messages[i]
            return i
    return None


def _indices(indices, count):
    """indices (a list or 1-D array of ints) checked against a list of count descriptors."""
    ids = np.asarray(indices)
    if ids.ndim != 1 or (len(ids) and ids.dtype.kind not in "iu"):
        raise nb.nixlInvalidParamError("descriptor indices are a list or 1-D array of integers")
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        raise nb.nixlInvalidParamError(f"a descriptor index is outside 0..{count - 1}")
    return ids.astype(np.int64)


def _tensors(descs):
    """descs as a list of torch tensors, or None when it is not tensors."""
    is_tensor = lambda t: callable(getattr(t, "data_ptr", None)) and hasattr(t, "is_contiguous")  # noqa: E731
    if is_tensor(descs):
        return [descs]
    if isinstance(descs, (list, tuple)) and descs and all(is_tensor(t) for t in descs):
        return list(descs)
    return None
