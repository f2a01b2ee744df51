"""NIXL's low-level agent, nixl._bindings.nixlAgent (NIXL's C++ agent), on an xfer engine: the one
place xfer.nixl's agent logic lives. nixl._api.nixl_agent is built on it, as NIXL's is.

Methods keep the binding's names and arguments; they return nixl_status_t values (NIXL_SUCCESS,
NIXL_IN_PROG) and raise NIXL's exceptions (nixlNotFoundError...) for errors, whose text starts
with NIXL's status name and goes on with xfer's reason. Handles (backends, prepared descriptor
lists, transfers) are ints, as NIXL's pointers are, never 0."""

import atexit
import itertools
import logging
import os
import re
import sys
import threading
import time
import weakref

import numpy as np

from .. import Engine, XferError, _cluster_name
from .. import _errors
from . import _bindings as nb
from . import _telemetry
from . import logging as nixl_logging
from ._wire import NOTIFY_BYTES, Agents, Message, host_address, outside, region_table

log = logging.getLogger("xfer.nixl")

HOST_ENV = "XFER_NIXL_HOST"            # the address this process's agents listen on
TRANSPORT_ENV = "XFER_NIXL_TRANSPORT"  # forces one xfer transport, e.g. "tcp"
OUTCOMES_ENV = "XFER_NIXL_NOTIFY_OUTCOMES"  # "1": failed transfers' notifications too
SECRET_ENV = "XFER_SECRET_FILE"        # a shared secret: peers must prove they know it
ETCD_ENV = "NIXL_ETCD_ENDPOINTS"       # NIXL's metadata server: etcd (http://host:port[,...])
ETCD_NAMESPACE_ENV = "NIXL_ETCD_NAMESPACE"
_FETCH_RETRY = 0.1                     # seconds between lookups of an agent not in etcd yet
_KIND = {nb.DRAM_SEG: "host", nb.VRAM_SEG: "cuda"}
# Plugins: name -> (parameters, memory types). The memory ones take any name: xfer picks its
# transport per peer (shm, cma, tcp, ucx, cuda) whatever it is. POSIX answers queryMem only.
_PLUGINS = {"UCX": ({}, ["DRAM_SEG", "VRAM_SEG"]), "XFER": ({}, ["DRAM_SEG", "VRAM_SEG"]),
            "POSIX": ({}, ["FILE_SEG"])}
_QUERY_ONLY = ("POSIX",)
_RELEASE_WAIT = 10.0        # seconds releaseXferReq waits for a canceled transfer to stop
_COST_OBSERVED = -1         # estimateXferCost's method: an observation, not NIXL's analytical model

_handles = itertools.count(0x1000)  # handle numbers (ints, as NIXL's pointers), unique in the process
_live = weakref.WeakSet()  # agents not closed yet: closed at exit, before the interpreter goes


@atexit.register
def _close_all():
    for agent in list(_live):
        agent.close()


_log_configured = False
_log_lock = threading.Lock()  # (agents may be made on several threads at once)


def _configure_log():
    """Once: NIXL_LOG_LEVEL, when set, is also the level of xfer.nixl's own log, printed on
    stderr as NIXL's C++ core prints its own (NIXL's CI reads the listener's port there). The
    log still propagates: an application's own handlers get xfer.nixl's records as any
    library's (where one of them prints on stderr too, a line shows twice)."""
    global _log_configured
    level = nixl_logging.level_from_env()
    with _log_lock:
        if _log_configured or level is None:
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s xfer.nixl %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(level)
        _log_configured = True


def _name(agent):
    return agent.decode() if isinstance(agent, (bytes, bytearray)) else str(agent)


_NIXL_ERRORS = ((_errors.ConnectionLostError, nb.nixlRemoteDisconnectError),
                (_errors.NotConnectedError, nb.nixlRemoteDisconnectError),
                (_errors.CanceledError, nb.nixlCancelledError),
                (_errors.InvalidArgumentError, nb.nixlInvalidParamError),
                (_errors.RemoteAccessDeniedError, nb.nixlNotAllowedError),
                (_errors.UnsupportedError, nb.nixlNotSupportedError))


def _nixl_error(e):
    """The nixl exception for an xfer error (nixlBackendError for the others)."""
    for xfer_type, nixl_type in _NIXL_ERRORS:
        if isinstance(e, xfer_type):
            return nixl_type(str(e))
    return nb.nixlBackendError(str(e))


def _raise_nixl(e):
    raise _nixl_error(e) from e


class _Closed:
    """What a closed agent has for its engine and agent layer: any use raises nixlBackendError
    (NIXL's agents are never closed: they end when collected)."""

    def __init__(self, name):
        self._closed_agent = name  # (its only attribute: every other one raises)

    def __getattr__(self, attr):
        raise nb.nixlBackendError(f"agent {self._closed_agent!r} is closed")


class _Prepped:
    """prepXferDlist's list: one side's descriptors (peer: None for local memory), and the
    agent's engine's prepared list of them, made at the first makeXferReq that uses it."""

    def __init__(self, peer, rows):
        self.peer, self.rows = peer, rows
        self.lock = threading.Lock()
        self._list = None     # the engine's list; False: it cannot be prepared (tried once)

    def engine_list(self, engine):
        """The engine's prepared list of the rows (xfer.PreparedList), or None where the
        engine cannot prepare it (no rows; descriptors outside registered memory; a peer not
        connected yet, tried again next time): the transfers then take the plain path, which
        says why they fail, if they do."""
        with self.lock:
            if self._list is None and len(self.rows):
                addr, length = self.rows[:, 0], self.rows[:, 1]
                try:
                    self._list = (engine.prepare_local(addr, length) if self.peer is None
                                  else engine.prepare_remote(self.peer, addr, length))
                except (_errors.NotConnectedError, _errors.ConnectionLostError) as e:
                    log.debug("xfer.nixl: the descriptor list is not prepared yet (%s)", e)
                except XferError as e:
                    log.debug("xfer.nixl: the descriptor list is not prepared (%s); plain transfers", e)
                    self._list = False
            return self._list or None

    def forget_list(self, stale=None):
        """Drops the engine's list (stale: only when it is that one, whose session ended).
        Transfers made from it keep their own reference."""
        with self.lock:
            if stale is None or self._list is stale:
                self._list = None


class _Xfer:
    """A transfer: its descriptors, and how its last posting went."""

    def __init__(self, op, peer, local, remote, lengths, notif):
        self.op, self.peer, self.notif = op, peer, notif
        self.local, self.remote, self.lengths = local, remote, lengths
        self.nbytes = int(lengths.sum())  # (once: each completion needs it, and a sum costs ~1 µs)
        self.prepared = None  # (local _Prepped, its list, indices, remote _Prepped, its list, indices)
        self.request = None   # the engine's request of the last posting (None: none, or nothing to move)
        self.error = None     # the last posting's nixl error once seen: its status until posted again
        self.released = False  # released: never posted again (set and read under self.lock)
        self.lock = threading.Lock()  # (postings and the release)
        self.start_time = 0.0                         # time.time() of the last posting
        self.start = self.posted = self.ended = 0     # perf_counter_ns() of its steps (0: not yet)


class nixlAgent:
    """NIXL's nixlAgent(name, nixlAgentConfig) on an xfer engine. name: unique among the agents
    that meet (ValueError when empty). config.useListenThread: the engine listens on
    config.listenPort (0: a free port, said in the log at INFO), where agents send their
    metadata; otherwise on a free port."""

    def __init__(self, name, config):
        if not isinstance(config, nb.nixlAgentConfig):
            raise TypeError(f"nixlAgent(name, config): config is an nixlAgentConfig, "
                            f"not {type(config).__name__}")
        if not isinstance(config.syncMode, nb.nixl_thread_sync_t):
            raise TypeError(f"nixlAgentConfig.syncMode is a nixl_thread_sync_t, not {config.syncMode!r}")
        if not isinstance(name, (str, bytes, bytearray)):
            raise TypeError(f"an agent's name is a str, not {type(name).__name__}")
        self.name = _name(name)
        if not self.name:
            raise ValueError("Agent needs a non-empty name")
        # Tables by handle. Reads take no lock: a dict's get is atomic (the GIL; a free-threaded
        # build locks each dict operation), so a reader finds a handle added or removed at the
        # same time either there or not, and both are right answers. Writes take self._lock, so
        # that a check and the write that follows it (createBackend's, deregisterMem's) are one.
        self._lock = threading.Lock()
        self._backends = {}  # handle -> plugin name
        self._lists = {}     # handle -> _Prepped
        self._xfers = {}     # handle -> _Xfer
        self._regions = {}   # (addr, len, dev) -> [xfer Region]
        self._rates = {}     # peer address -> bytes/s of the last completed transfer (estimateXferCost)
        self._leaked = []    # _Xfers of handles collected while running (see _release_collected)
        _configure_log()
        self._telemetry = _telemetry.for_agent(self.name, config.captureTelemetry)
        port = int(config.listenPort) if config.useListenThread else 0
        # XFER_NIXL_NOTIFY_OUTCOMES=1: transfers toward this agent that do not complete are told
        # here too (takeFailedNotifs), at a cost per notified transfer.
        options = {"notify_max_message_bytes": NOTIFY_BYTES,
                   "notify_outcomes": os.environ.get(OUTCOMES_ENV, "0") == "1"}
        if os.environ.get(SECRET_ENV):
            options["secret_file"] = os.environ[SECRET_ENV]
        if os.environ.get(TRANSPORT_ENV):
            options["transport"] = os.environ[TRANSPORT_ENV]
        self._etcd = _etcd_url()
        if self._etcd:  # (the agent is published under its name from now on)
            options.update(metadata=self._etcd, cluster_name=_cluster_name(self.name))
        self._fetching = {}  # agent name -> _Fetch: etcd lookups under way (under _fetch_lock)
        self._fetch_lock = threading.Lock()
        host = self._host = os.environ.get(HOST_ENV) or host_address()
        try:
            self._engine = Engine(f"{host}:{port}", **options)
        except XferError as e:
            _raise_nixl(e)
        self._agents = Agents(self._engine, self.name)
        if config.useListenThread:  # (NIXL's CI reads the port of an OS-assigned one from this line)
            log.log(logging.INFO if port == 0 else logging.DEBUG,
                    "MD listener is listening on port %d", self.listenPort())
        log.info("xfer.nixl agent %s listens at %s", self.name, self._engine.name)
        _live.add(self)

    def __del__(self):
        self.close()

    def close(self):
        """Stops the agent: its thread, the transfers of handles collected while running (it
        waits until they stopped, up to 10 s), its engine, and its telemetry file (not in NIXL:
        its agents end when collected, which this also does). Later calls that need the engine
        raise nixlBackendError."""
        lock = self.__dict__.get("_lock")
        if lock is None:  # (__init__ failed before anything was made)
            return
        with lock:
            agents, engine = self.__dict__.get("_agents"), self.__dict__.get("_engine")
            if not isinstance(agents, Agents):  # (closed already, or never opened)
                return
            self._agents = self._engine = _Closed(self.name)
            self._fetching.clear()
            leaked, self._leaked = self._leaked, []
        agents.stop()
        _wait_stopped(leaked)
        engine.close()
        if self._telemetry is not None:
            self._telemetry.close()

    def listenPort(self):
        """xfer's: the port the engine listens on (the metadata listener's, when it is one)."""
        return int(self._engine.name.rsplit(":", 1)[1])

    # ------------------------------------------------------------ backends
    def getAvailPlugins(self):
        return list(_PLUGINS)

    def getPluginParams(self, type):
        """(parameters, memory types) of a plugin; nixlNotFoundError for an unknown one."""
        if type not in _PLUGINS:
            raise nb.nixlNotFoundError(f"no plugin {type!r} (xfer.nixl offers {list(_PLUGINS)})")
        params, mems = _PLUGINS[type]
        return dict(params), list(mems)

    def getBackendParams(self, backend):
        return self.getPluginParams(self._backend(backend))

    def createBackend(self, type, initParams):
        """A backend of the plugin; its handle. initParams (str -> str) are taken and not needed.
        nixlNotFoundError for an unknown plugin, nixlInvalidParamError for one created already."""
        if not isinstance(initParams, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in initParams.items()):
            raise TypeError(f"createBackend: initParams is a dict of str to str, not {initParams!r}")
        self.getPluginParams(type)
        with self._lock:
            if type in self._backends.values():
                raise nb.nixlInvalidParamError(f"createBackend: backend {type} was created already")
            if type not in _QUERY_ONLY and not any(b not in _QUERY_ONLY for b in self._backends.values()):
                log.info("xfer.nixl agent %s: backend %s asked for; xfer picks its best transport "
                         "for each peer", self.name, type)
            handle = next(_handles)
            self._backends[handle] = type
        return handle

    def _backend(self, handle):
        """The plugin name of a backend handle (nixlNotFoundError for a handle not of this agent)."""
        name = self._backends.get(handle)  # (no lock: see __init__)
        if name is None:
            raise nb.nixlNotFoundError(f"no backend with handle {handle!r} in agent {self.name}")
        return name

    def _check_backends(self, backends):
        for handle in backends or ():
            self._backend(handle)

    # ------------------------------------------------------------ memory
    def registerMem(self, descs, backends=()):
        """Registers every descriptor (all or nothing); DRAM and VRAM only."""
        _expect(descs, nb.nixlRegDList, "registerMem")
        self._check_backends(backends)
        kind = _KIND.get(descs.getType())
        if kind is None:
            raise nb.nixlNotSupportedError(f"registerMem: {descs.getType().name} memory (xfer.nixl "
                                           "registers DRAM and VRAM)")
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
                    log.warning("xfer.nixl: registerMem could not undo a registration: %s", undo)
            _raise_nixl(e)
        with self._lock:
            for key, region in done:
                self._regions.setdefault(key, []).append(region)
        if self._telemetry is not None and done:
            self._telemetry.registered(sum(key[1] for key, _ in done))
        return nb.NIXL_SUCCESS

    def deregisterMem(self, descs, backends=()):
        """All of the list or nothing: a descriptor not registered raises before any goes."""
        _expect(descs, nb.nixlRegDList, "deregisterMem")
        self._check_backends(backends)
        taken = []
        with self._lock:
            for addr, length, dev, _ in descs:
                held = self._regions.get((addr, length, dev))
                if not held:
                    for key, region in taken:
                        self._regions[key].append(region)
                    raise nb.nixlNotFoundError(f"deregisterMem: ({addr:#x}, {length}) is not registered")
                taken.append(((addr, length, dev), held.pop()))
        for _, region in taken:
            try:
                self._engine.deregister(region)
            except XferError as e:
                _raise_nixl(e)
        if self._telemetry is not None and taken:
            self._telemetry.deregistered(sum(key[1] for key, _ in taken))
        return nb.NIXL_SUCCESS

    def queryMem(self, descs, backend):
        """POSIX: for each descriptor, the file named by its meta: {"size", "mode", "mtime"} (as
        decimal strings, from stat), or None when it cannot be stat'ed. Memory backends do not
        answer it (nixlNotSupportedError; NIXL's UCX neither)."""
        _expect(descs, nb.nixlRegDList, "queryMem")
        if self._backend(backend) not in _QUERY_ONLY:
            raise nb.nixlNotSupportedError(f"queryMem: backend {self._backend(backend)} does not answer "
                                           "it (POSIX does, for files)")
        return [_stat(meta) for _, _, _, meta in descs]

    # ------------------------------------------------------------ metadata
    def getLocalMD(self):
        return self._agents.metadata()

    def getLocalPartialMD(self, descs, inc_conn_info=False, backends=()):
        """Metadata that gives the loading agent only these registered descriptors (and how to
        reach this agent when inc_conn_info)."""
        regions = self._partial_regions(descs, backends, "getLocalPartialMD")
        return self._agents.metadata(regions, inc_conn_info)

    def _partial_regions(self, descs, backends, what):
        """[(addr, len)] of an nixlRegDList whose descriptors are all in registered memory."""
        _expect(descs, nb.nixlRegDList, what)
        self._check_backends(backends)
        with self._lock:
            held = region_table((a, n) for (a, n, _), regions in self._regions.items() if regions)
        rows = descs._rows
        bad = outside(held, rows)
        if bad.any():
            addr, length, _ = rows[bad.argmax()].tolist()
            raise nb.nixlNotFoundError(f"{what}: ({addr:#x}, {length}) is not registered memory")
        return rows[:, :2].tolist()

    def loadRemoteMD(self, remote_metadata):
        """Loads a peer's getLocalMD() or getLocalPartialMD(); returns its name (bytes)."""
        try:
            name = self._agents.load(remote_metadata)
        except ValueError as e:
            raise nb.nixlInvalidParamError(str(e)) from None
        except KeyError as e:
            raise nb.nixlNotFoundError(e.args[0]) from None
        except XferError as e:
            _raise_nixl(e)
        return name.encode()

    def invalidateRemoteMD(self, remote_agent):
        """Forgets the agent and disconnects from it; NIXL_ERR_NOT_FOUND (returned, not raised)
        when it was not known."""
        return nb.NIXL_SUCCESS if self._agents.forget(_name(remote_agent)) else nb.NIXL_ERR_NOT_FOUND

    def sendLocalMD(self, ip_addr="", port=0):
        """Sends this agent's metadata to the agent listening on ip_addr:port. Without ip_addr,
        to etcd (NIXL_ETCD_ENDPOINTS), where the agent is published from its creation on."""
        if not ip_addr and self._etcd:
            return
        self._listener_call("sendLocalMD", ip_addr, port, Message.METADATA, self._agents.metadata())

    def sendLocalPartialMD(self, descs, inc_conn_info=False, backends=(), ip_addr="", port=0, label=""):
        """getLocalPartialMD's metadata to the agent listening on ip_addr:port; without
        ip_addr, to etcd's agents: served under label (needed) to the agents that fetch it."""
        metadata = self.getLocalPartialMD(descs, inc_conn_info, backends)
        if not ip_addr and self._etcd:
            if not label:
                raise nb.nixlInvalidParamError("sendLocalPartialMD: a label is needed to send partial "
                                               "metadata through etcd")
            self._agents.serve(label, metadata)
            return
        self._listener_call("sendLocalPartialMD", ip_addr, port, Message.METADATA, metadata)

    def fetchRemoteMD(self, remote_agent, ip_addr="", port=0, label=""):
        """Asks the agent listening on ip_addr:port for its metadata (without ip_addr: looks it
        up in etcd until it is there; with a label, the partial metadata it serves under it);
        checkRemoteMD says when it came."""
        if not ip_addr and self._etcd:
            name = _name(remote_agent)
            address = self._agents.address(name)
            if not (label and address is not None and self._ask(name, address, label)):
                self._fetch(name, [label])
            return
        self._listener_call("fetchRemoteMD", ip_addr, port, Message.ASK, label.encode())

    def _fetch(self, name, labels):
        """Looks the agent up in etcd (one lookup per agent at a time), then asks it for each
        of labels ("": its whole metadata)."""
        with self._fetch_lock:
            fetch = self._fetching.get(name)
            if fetch is None:
                fetch = self._fetching[name] = _Fetch(self._engine, _cluster_name(name))
            fetch.labels.update(labels)

    def _fetched(self, name):
        """Moves an etcd lookup of that agent on (see _Fetch): once connected, the agent is
        known (a lookup without a label) and asked for the metadata served under each label.
        Labels it could not be asked for are looked up again (a log line)."""
        if not self._fetching:  # (no lock: see __init__; the common case, on every transfer made)
            return
        with self._fetch_lock:
            fetch = self._fetching.get(name)
            address = fetch.address() if fetch is not None else None
            if address is None:
                return
            del self._fetching[name]
        if "" in fetch.labels:
            self._agents.remember(name, address)
        failed = [label for label in fetch.labels - {""} if not self._ask(name, address, label)]
        if failed:
            self._fetch(name, failed)

    def _ask(self, name, address, label):
        """Asks the agent for the metadata it serves under label; False (a log line) when the
        request could not be sent."""
        try:
            self._agents.tell(address, Message.ASK, label.encode())
            return True
        except XferError as e:
            log.warning("xfer.nixl: asking agent %s for its metadata %r failed: %s (looked up "
                        "again)", name, label, e)
            return False

    def invalidateLocalMD(self, ip_addr="", port=0):
        """Tells the agent at ip_addr:port (every known one when none is given) to forget us;
        one that is gone already is not an error (a log line)."""
        if not ip_addr:
            self._agents.tell_all(Message.FORGET)
            return
        try:
            self._agents.tell(self._listener(ip_addr, port), Message.FORGET)
        except XferError as e:
            log.info("xfer.nixl: invalidateLocalMD: %s:%s is gone (%s)", ip_addr, port, e)

    def _listener_call(self, what, ip_addr, port, kind, payload):
        if not ip_addr:
            raise nb.nixlNotSupportedError(f"{what}: give ip_addr, or set {ETCD_ENV} for a metadata server")
        self._tell(self._listener(ip_addr, port), kind, payload)

    def _tell(self, address, kind, payload):
        try:
            self._agents.tell(address, kind, payload)
        except XferError as e:
            _raise_nixl(e)

    def _listener(self, ip_addr, port):
        """The engine address of the agent NIXL code reaches at ip_addr:port. NIXL's listener
        takes every address of its host; an agent here listens on one (XFER_NIXL_HOST, or the
        default route's), so a loopback address (or this host's) names the agent of this host
        that listens on that port."""
        local = ip_addr in ("localhost", "::1", self._host) or ip_addr.startswith("127.")
        host = self._host if local else ip_addr
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def checkRemoteMD(self, remote_agent, descs):
        """NIXL_SUCCESS once this agent has the agent's metadata and every descriptor of descs
        (an nixlXferDList) is memory it may reach: in the partial metadata it was sent, or, with
        whole metadata, in memory the agent registered. Else NIXL_ERR_NOT_FOUND (not raised)."""
        _expect(descs, nb.nixlXferDList, "checkRemoteMD")
        name = _name(remote_agent)
        self._fetched(name)
        address = self._agents.address(name)
        if address is None:
            return nb.NIXL_ERR_NOT_FOUND
        if len(descs) == 0:
            return nb.NIXL_SUCCESS
        exposed = self._agents.exposed(name)
        if exposed is None:
            try:
                exposed = region_table((r.addr, r.len) for r in self._engine.remote_regions(address))
            except XferError as e:
                log.info("xfer.nixl: checkRemoteMD: the regions of %s are not known: %s", name, e)
                return nb.NIXL_ERR_NOT_FOUND
        return nb.NIXL_ERR_NOT_FOUND if outside(exposed, descs._rows).any() else nb.NIXL_SUCCESS

    def makeConnection(self, remote_agent, backends=()):
        """Connects to the agent now (transfers connect on first use otherwise); nothing when
        already connected. nixlNotFoundError for an agent whose metadata is not loaded."""
        self._check_backends(backends)
        address = self._peer(_name(remote_agent))
        try:
            self._agents.connect(address)
        except XferError as e:
            _raise_nixl(e)
        return nb.NIXL_SUCCESS

    # ------------------------------------------------------------ transfers
    def prepXferDlist(self, *args, **kwargs):
        """NIXL's two forms, by position or keyword: prepXferDlist(agent_name, descs, backend=[]),
        a list of an agent's memory (this agent's own name: loopback; NIXL_INIT_AGENT: local),
        and prepXferDlist(descs, backend=[]), of local memory. Its handle (for makeXferReq).
        TypeError for arguments that fit neither."""
        agent_name, descs, backend = _prep_args(*args, **kwargs)
        _expect(descs, nb.nixlXferDList, "prepXferDlist")
        self._check_backends(backend)
        peer = None
        if agent_name not in (None, nb.NIXL_INIT_AGENT):
            peer = self._peer(agent_name, descs._rows, "prepXferDlist")
        handle = next(_handles)
        with self._lock:
            self._lists[handle] = _Prepped(peer, descs._rows)
        return handle

    def makeXferReq(self, operation, local_side, local_indices, remote_side, remote_indices,
                    notif_msg=b"", backend=(), skip_desc_merg=False):
        """A transfer of the prepared lists' descriptors at those indices (pairwise)."""
        op = _op(operation)
        self._check_backends(backend)
        local, remote = self._list(local_side), self._list(remote_side)
        if local.peer is not None:
            raise nb.nixlInvalidParamError("makeXferReq: the local side was prepared for an agent's "
                                           "memory (prep it with NIXL_INIT_AGENT)")
        local_ids = _indices(local_indices, len(local.rows))
        remote_ids = _indices(remote_indices, len(remote.rows))
        xfer = self._new_xfer(op, local.rows[local_ids], remote.rows[remote_ids], remote.peer, notif_msg)
        if len(local_ids) and remote.peer is not None:
            mine, theirs = local.engine_list(self._engine), remote.engine_list(self._engine)
            if mine is not None and theirs is not None:
                xfer.prepared = (local, mine, local_ids, remote, theirs, remote_ids)
        return self._keep(xfer)

    def createXferReq(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"", backend=()):
        """A transfer of local_descs to or from remote_descs of remote_agent (pairwise)."""
        op = _op(operation)
        _expect(local_descs, nb.nixlXferDList, "createXferReq")
        _expect(remote_descs, nb.nixlXferDList, "createXferReq")
        self._check_backends(backend)
        peer = self._peer(_name(remote_agent), remote_descs._rows, "createXferReq")
        return self._keep(self._new_xfer(op, local_descs._rows, remote_descs._rows, peer, notif_msg))

    def _new_xfer(self, op, local, remote, peer, notif):
        if peer is None:
            raise nb.nixlInvalidParamError("the remote side is this agent's local descriptors")
        if local.shape != remote.shape or not np.array_equal(local[:, 1], remote[:, 1]):
            raise nb.nixlInvalidParamError(f"local and remote descriptors differ in count or lengths "
                                           f"({len(local)} and {len(remote)})")
        return _Xfer(op, peer, local[:, 0].copy(), remote[:, 0].copy(), local[:, 1].copy(), _bytes(notif))

    def _keep(self, xfer):
        handle = next(_handles)
        with self._lock:
            self._xfers[handle] = xfer
        return handle

    def _list(self, handle):
        prepped = self._lists.get(handle)  # (no lock: see __init__)
        if prepped is None:
            raise nb.nixlInvalidParamError(f"no prepared descriptor list {handle!r} (released, or "
                                           "not of this agent)")
        return prepped

    def _xfer(self, handle):
        xfer = self._xfers.get(handle)  # (no lock: see __init__)
        if xfer is None:
            raise _no_xfer(handle)
        return xfer

    def _peer(self, name, rows=None, what=""):
        """The engine address of the agent (this agent's own: loopback). nixlNotFoundError when
        its metadata is not loaded, or rows (addr, len, dev) are not all in the partial metadata
        it sent."""
        if name == self.name:  # (loopback: NIXL lets an agent name itself as the remote side)
            return self._engine.name
        self._fetched(name)
        address = self._agents.address(name)
        if address is None:
            raise nb.nixlNotFoundError(f"no metadata of agent {name!r} (add_remote_agent first)")
        exposed = self._agents.exposed(name)
        if rows is not None and exposed is not None and outside(exposed, rows).any():
            raise nb.nixlNotFoundError(f"{what}: descriptors of agent {name!r} outside the partial "
                                       "metadata it sent")
        return address

    def postXferReq(self, reqh, notif_msg=b""):
        """Posts the transfer; NIXL_SUCCESS when it completed at once, else NIXL_IN_PROG
        (failures raise, and stay its status until it is posted again). notif_msg: this
        posting's notification, over the transfer's own."""
        xfer = self._xfer(reqh)
        with xfer.lock:
            if xfer.released:  # (releaseXferReq had the lock while this call waited for it)
                raise _no_xfer(reqh)
            return self._post(xfer, notif_msg)

    def _post(self, xfer, notif_msg):
        if xfer.request is not None and not xfer.request.done():
            raise nb.nixlRepostActiveError("postXferReq: the transfer's last posting is still running")
        notif = _bytes(notif_msg) or xfer.notif
        xfer.request = xfer.error = None
        xfer.start_time, xfer.start, xfer.posted, xfer.ended = time.time(), time.perf_counter_ns(), 0, 0
        try:
            xfer.request = self._submit(xfer, notif)
        except XferError as e:
            self._fail(xfer, e)
        xfer.posted = time.perf_counter_ns()
        return self._status(xfer)

    def _submit(self, xfer, notif):
        """Starts the transfer on the engine: its request; None when it has no descriptors (its
        notification alone goes, now)."""
        if len(xfer.local) == 0:
            if notif:
                self._agents.notify(xfer.peer, notif)
            return None
        framed = self._agents.framed(notif) if notif else None
        request = self._post_prepared(xfer, framed) if xfer.prepared else None
        if request is None:
            move = self._engine.read_async if xfer.op == nb.NIXL_READ else self._engine.write_async
            request = move(xfer.peer, local=xfer.local, remote=xfer.remote, length=xfer.lengths,
                           notify=framed)
        return request

    def _post_prepared(self, xfer, framed):
        """Posts a makeXferReq transfer over the engine's prepared lists: no descriptor is
        checked or looked up again, and a transfer posted again reuses its plan (while it is
        among the last 8 posted over its remote list). None when the remote list's session has
        ended: the transfer then takes the plain path from now on, which reaches the agent again
        once the agent layer has connected to it again."""
        local, mine, local_ids, remote, theirs, remote_ids = xfer.prepared
        move = (self._engine.read_prepared_async if xfer.op == nb.NIXL_READ
                else self._engine.write_prepared_async)
        try:
            return move(mine, local_ids, theirs, remote_ids, notify=framed)
        except _errors.ConnectionLostError:
            xfer.prepared = None
            remote.forget_list(theirs)
            return None

    def getXferStatus(self, reqh):
        """NIXL_SUCCESS once the transfer completed, NIXL_IN_PROG while it runs; its error once
        its posting failed (nixlNotPostedError before it was posted)."""
        return self._status(self._xfer(reqh))

    def _status(self, xfer):
        if xfer.error is not None:  # (raised again at each check, as NIXL keeps the error status)
            raise xfer.error.with_traceback(None)
        if xfer.ended:
            return nb.NIXL_SUCCESS
        request = xfer.request
        if request is not None:
            if not request.done():
                return nb.NIXL_IN_PROG
            try:
                request.wait(0)  # (raises its error)
            except XferError as e:
                self._fail(xfer, e)
        elif not xfer.posted:
            raise nb.nixlNotPostedError("getXferStatus: the transfer was never posted")
        self._completed(xfer)
        return nb.NIXL_SUCCESS

    def _fail(self, xfer, e):
        """Makes the xfer error e the posting's status (counted once in telemetry, as NIXL
        counts a transfer's error when its status becomes it) and raises it."""
        xfer.error = _nixl_error(e)
        if self._telemetry is not None:
            self._telemetry.error(xfer.error)
        raise xfer.error from e

    def _completed(self, xfer):
        """The posting completed: its time, the rate to its agent, and its telemetry."""
        xfer.ended = time.perf_counter_ns()
        if xfer.nbytes:
            self._rates[xfer.peer] = xfer.nbytes / max(xfer.ended - xfer.start, 1) * 1e9
        if self._telemetry is not None:
            post_us, xfer_us = (xfer.posted - xfer.start) // 1000, (xfer.ended - xfer.start) // 1000
            self._telemetry.transfer_done(xfer.op == nb.NIXL_WRITE, xfer.nbytes, post_us, xfer_us)

    def getXferTelemetry(self, reqh):
        """The transfer's times (µs: start, post, transfer), bytes and descriptors.
        nixlNoTelemetryError when the agent captures no telemetry (config's captureTelemetry,
        or NIXL_TELEMETRY_ENABLE)."""
        xfer = self._xfer(reqh)
        if self._telemetry is None:
            raise nb.nixlNoTelemetryError("getXferTelemetry: telemetry is off (capture_telemetry, "
                                          "NIXL_TELEMETRY_ENABLE)")
        us = lambda ns: max(ns, 0) // 1000  # noqa: E731
        return nb.nixlXferTelemetry(startTime=int(xfer.start_time * 1e6),
                                    postDuration=us(xfer.posted - xfer.start) if xfer.posted else 0,
                                    xferDuration=us(xfer.ended - xfer.start) if xfer.ended else 0,
                                    totalBytes=xfer.nbytes, descCount=len(xfer.lengths))

    def queryXferBackend(self, reqh):
        """The handle of the backend the transfer is told to have used: the agent's first
        memory backend (xfer picks the transport itself). nixlNotFoundError when it has none."""
        self._xfer(reqh)
        with self._lock:
            handles = [h for h, name in self._backends.items() if name not in _QUERY_ONLY]
        if not handles:
            raise nb.nixlNotFoundError("queryXferBackend: the agent has no memory backend")
        return handles[0]

    def estimateXferCost(self, req_handle):
        """(duration µs, error margin µs, method): the transfer's bytes at the rate of this
        agent's last completed transfer to the same agent (0 before one has completed); method:
        not NIXL_COST_ANALYTICAL_BACKEND (an observation, not a model)."""
        xfer = self._xfer(req_handle)
        rate = self._rates.get(xfer.peer)
        duration = int(xfer.nbytes / rate * 1e6) if rate else 0
        return duration, 0, _COST_OBSERVED

    def releaseXferReq(self, reqh):
        """Cancels the transfer if it is still running and waits until no byte of it moves any
        more (batches already started finish); then forgets it. A transfer that does not stop
        within 10 s raises nixlBackendError and stays."""
        xfer = self._xfer(reqh)
        with xfer.lock:
            if not _stopped(xfer.request, _RELEASE_WAIT):
                raise nb.nixlBackendError("releaseXferReq: the transfer did not stop in time")
            self._forget(reqh, xfer)
        return nb.NIXL_SUCCESS

    def _release_collected(self, reqh):
        """nixl_xfer_handle's release when it is collected, which must not wait: a transfer
        still running is canceled, forgotten, and kept until it stopped; close() waits for
        those (NIXL keeps such handles in a list the agent releases again when it goes)."""
        xfer = self._xfers.get(reqh)
        if xfer is None:
            return
        with xfer.lock:
            running = not _stopped(xfer.request, 0)
            self._forget(reqh, xfer)
        if running:
            with self._lock:
                self._leaked = [x for x in self._leaked if not x.request.done()] + [xfer]

    def _forget(self, reqh, xfer):
        """Forgets the transfer (under xfer.lock: a posting waiting for it then sees released)."""
        xfer.released = True
        with self._lock:
            self._xfers.pop(reqh, None)

    def releasedDlistH(self, handle):
        prepped = self._list(handle)
        with self._lock:
            self._lists.pop(handle, None)
        prepped.forget_list()  # (the engine's list goes with the last transfer made from it)
        return nb.NIXL_SUCCESS

    def prepMemView(self, dlist, backends=()):
        """NIXL's memory views are for GPU kernels over UCX's GPU device API, which xfer.nixl
        does not offer (HAVE_UCX_GPU_DEVICE_API is False): nixlNotSupportedError."""
        raise nb.nixlNotSupportedError("prepMemView: memory views need UCX's GPU device API, which "
                                       "xfer.nixl does not offer (HAVE_UCX_GPU_DEVICE_API)")

    def releaseMemView(self, mvh):
        raise nb.nixlNotSupportedError("releaseMemView: xfer.nixl makes no memory views")

    # ------------------------------------------------------------ notifications
    def getNotifs(self, notif_map, backends=()):
        """Adds the notifications that came since the last call to notif_map ({agent name:
        [message bytes]}) and returns it."""
        self._check_backends(backends)
        for name, msgs in self._agents.take_notifs().items():
            notif_map.setdefault(name, []).extend(msgs)
        return notif_map

    def genNotif(self, remote_agent, msg, backends=()):
        self._check_backends(backends)
        try:
            self._agents.notify(self._peer(_name(remote_agent)), _bytes(msg))
        except XferError as e:
            _raise_nixl(e)
        return nb.NIXL_SUCCESS

    def takeFailedNotifs(self):
        """xfer's: {agent name: [FailedNotif]}, the transfers toward this agent that did not
        complete since the last call (see nixl_agent.get_failed_notifs)."""
        return self._agents.take_failed()


class _Fetch:
    """An etcd lookup of one agent (fetchRemoteMD without an address): a connect by its cluster
    name, started again with back-off (0.1 s doubling to 1 s) while it fails. labels: what to
    ask the agent for once connected ("": its whole metadata; others: what it serves under them)."""

    def __init__(self, engine, cluster_name):
        self.engine, self.cluster_name, self.labels = engine, cluster_name, set()
        self.wait_s, self.logged = _FETCH_RETRY, False
        self.connecting, self.started = engine.connect_async(cluster_name, 10.0), time.monotonic()

    def address(self):
        """The agent's engine address once connected; None before (a connect that failed is
        started again: see retry)."""
        if not self.connecting.done():
            return None
        try:
            self.connecting.wait(0)
        except _errors.AlreadyConnectedError:
            pass  # (connected, or a connect to it under way: peer_info below tells)
        except XferError as e:
            self.retry(e)
            return None
        try:
            return self.engine.peer_info(self.cluster_name).name
        except XferError as e:  # (another connect to it is still under way)
            self.retry(e)
            return None

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


def _expect(value, cls, what):
    if not isinstance(value, cls):
        raise TypeError(f"{what}: expected an {cls.__name__}, not {type(value).__name__}")


def _op(operation):
    if not isinstance(operation, nb.nixl_xfer_op_t):
        raise TypeError(f"an operation is NIXL_READ or NIXL_WRITE (nixl_xfer_op_t), not {operation!r}")
    return operation


def _bytes(m):
    if m is None:
        return b""
    return m.encode() if isinstance(m, str) else bytes(m)


def _no_xfer(handle):
    return nb.nixlInvalidParamError(f"no transfer {handle!r} (released, or not of this agent)")


def _stopped(request, wait_s):
    """Cancels the request if it still runs; whether it stopped within wait_s seconds."""
    if request is None or request.done():
        return True
    request.cancel()
    try:
        request.wait(wait_s)
    except XferError:
        pass  # (canceled, failed, or not stopped yet: done() tells)
    return request.done()


def _wait_stopped(xfers):
    """Waits (10 s in all) until the transfers' requests stopped; a log line for those that did not."""
    deadline = time.monotonic() + _RELEASE_WAIT
    for xfer in xfers:
        if not _stopped(xfer.request, max(deadline - time.monotonic(), 0)):
            log.warning("xfer.nixl: a released transfer did not stop in time; the engine closes under it")


def _prep_remote_args(agent_name, descs, backend=()):
    if not isinstance(agent_name, (str, bytes, bytearray)):
        raise TypeError("agent_name is a str")
    return _name(agent_name), descs, backend


def _prep_local_args(descs, backend=()):
    return None, descs, backend


def _prep_args(*args, **kwargs):
    """prepXferDlist's arguments as (agent name or None, descs, backend), read as NIXL's
    binding reads them: the first of its two forms that takes them."""
    for form in (_prep_remote_args, _prep_local_args):
        try:
            return form(*args, **kwargs)
        except TypeError:
            pass
    raise TypeError("prepXferDlist(): incompatible arguments; it takes (agent_name, descs, "
                    f"backend=[]) or (descs, backend=[]), not {len(args)} positional and "
                    f"{sorted(kwargs)}")


def _stat(meta):
    """queryMem's answer for the file named by meta (bytes): None when it cannot be stat'ed."""
    path = meta.decode(errors="surrogateescape") if isinstance(meta, bytes) else str(meta)
    if not path:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return {"size": str(st.st_size), "mode": str(st.st_mode), "mtime": str(int(st.st_mtime))}


def _indices(indices, count):
    """indices (a list or 1-D array of ints) checked against a list of count descriptors."""
    ids = np.asarray(indices)
    if ids.ndim != 1 or (len(ids) and ids.dtype.kind not in "iu"):
        raise nb.nixlInvalidParamError("descriptor indices are a list or 1-D array of integers")
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        raise nb.nixlInvalidParamError(f"a descriptor index is outside 0..{count - 1}")
    return ids.astype(np.int64)
