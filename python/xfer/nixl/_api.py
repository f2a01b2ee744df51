"""NIXL's nixl._api (nixl_agent, nixl_agent_config...) on xfer. See xfer/nixl/__init__.py.

nixl_agent is built on the low-level agent (nixl._bindings.nixlAgent, in _agent) as NIXL's is:
it reads NIXL's argument forms (tuples, arrays, tensors, names) into descriptor lists and
backend handles, calls the low-level agent, and turns its statuses into NIXL's strings."""

import enum
import logging
import pickle
import sys
import threading

import numpy as np

from . import _bindings as nixlBind  # (NIXL's _api has the bindings under this name; code uses it)
from ._agent import _bytes, _name
from ._bindings import DEFAULT_COMM_PORT, nixlRegDList, nixlRemoteDList, nixlXferDList  # noqa: F401
from ._wire import FailedNotif  # noqa: F401  (get_failed_notifs's items)

log = logging.getLogger("xfer.nixl")

__all__ = ["DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
           "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle"]

_MEMS = {"DRAM": nixlBind.DRAM_SEG, "VRAM": nixlBind.VRAM_SEG, "FILE": nixlBind.FILE_SEG,
         "BLOCK": nixlBind.BLK_SEG, "OBJ": nixlBind.OBJ_SEG, "cpu": nixlBind.DRAM_SEG,
         "cuda": nixlBind.VRAM_SEG}
_OPS = {"READ": nixlBind.NIXL_READ, "WRITE": nixlBind.NIXL_WRITE}
_STATES = {nixlBind.NIXL_SUCCESS: "DONE", nixlBind.NIXL_IN_PROG: "PROC"}

nixl_backend_handle = int  # (a backend's handle: the low-level agent's int)


class nixl_thread_sync_t(enum.Enum):
    """nixl_agent_config's sync_mode: the low-level agent's modes (each member's value)."""

    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT  # (NONE, as in NIXL)


class nixl_agent_config:
    """NIXL's agent options. enable_listen_thread: the agent listens on listen_port (0: a free
    port) for the metadata exchange (send_local_metadata, fetch_remote_metadata); otherwise on a
    free port. The progress thread is always on. backends: names (see get_plugin_list).
    sync_mode: a nixl_thread_sync_t, or None (STRICT with the listener, else NONE); TypeError
    for anything else."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=DEFAULT_COMM_PORT,
                 capture_telemetry=False, num_threads=0, backends=("UCX",), sync_mode=None):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.backends = list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode


def _low_config(conf):
    """The low-level agent's nixlAgentConfig for a nixl_agent_config."""
    default = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen
               else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
    low = nixlBind.nixlAgentConfig()
    low.useProgThread = conf.enable_pthread
    low.useListenThread = conf.enable_listen
    low.listenPort = conf.port
    low.syncMode = (conf.sync_mode or default).value
    low.captureTelemetry = conf.capture_telemetry
    return low


class _LowHandle:
    """A handle of the low-level agent (its int in _handle), released once: by the agent's
    release call, by release(), or when collected (_collected)."""

    __slots__ = ("_handle", "_agent", "_released")

    def __init__(self, agent, value):
        self._handle, self._agent, self._released = int(value), agent, False

    def __repr__(self):
        return f"{type(self).__name__}({self._handle:#x}, released={self._released})"

    def release(self):
        if not self._released:
            self._free()
            self._released = True

    def __del__(self):
        if not self._released:
            try:
                self._collected()
            except Exception as e:  # (collected: nothing to raise to)
                self._not_released(e)


class nixl_prepped_dlist_handle(_LowHandle):
    """prep_xfer_dlist's handle; released by release_dlist_handle, release(), or when
    collected."""

    __slots__ = ()

    def _free(self):
        self._agent.releasedDlistH(self._handle)

    def _collected(self):
        self.release()

    def _not_released(self, e):
        log.debug("xfer.nixl: a descriptor list handle was not released when collected: %s", e)


class nixl_xfer_handle(_LowHandle):
    """A transfer's handle; released by release_xfer_handle, release() (a running transfer is
    canceled first, and waited for), or when collected (never waiting: see
    nixlAgent._release_collected)."""

    __slots__ = ()

    def _free(self):
        self._agent.releaseXferReq(self._handle)

    def _collected(self):
        self._agent._release_collected(self._handle)

    def _not_released(self, e):
        log.warning("xfer.nixl: a transfer handle could not be released when collected: %s", e)


class nixl_agent:
    """NIXL's agent. agent_name: unique among the agents that meet (ValueError when empty).
    self.agent is the low-level agent (nixl._bindings.nixlAgent) it is built on."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None and instantiate_all:
            instantiate_all = False  # (as NIXL: the config's backends win)
            log.warning("xfer.nixl: instantiate_all is ignored when a config is given")
        conf = nixl_conf or nixl_agent_config()
        # (nixlBind.nixlAgent is looked up now: NIXL's tests spy on it)
        self.agent = nixlBind.nixlAgent(agent_name, _low_config(conf))
        self.name = agent_name
        self.notifs = {}
        self._failed = {}  # agent name -> [FailedNotif] taken from the agent, not by the caller yet
        # (self.notifs and self._failed are read, then taken from, under it: each message goes
        # to one caller, whatever the threads; reentrant: the methods call each other)
        self._notif_lock = threading.RLock()
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self.plugin_list = self.agent.getAvailPlugins()
        for b in (self.plugin_list if instantiate_all else conf.backends):
            if b in self.plugin_list:
                self.create_backend(b, {"num_threads": str(conf.num_threads)} if conf.num_threads > 0 else {})
            else:
                log.warning("xfer.nixl agent %s: skipping backend %s (xfer.nixl offers %s)",
                            self.name, b, self.plugin_list)

    def close(self):
        """Stops the agent (not in NIXL: its agents end when collected, which this also does)."""
        self.agent.close()

    # ------------------------------------------------------------ backends
    def get_plugin_list(self):
        return list(self.plugin_list)

    def create_backend(self, backend, initParams=None):
        """A backend of the plugin (see get_plugin_list). nixlNotFoundError for an unknown one."""
        self.backends[backend] = self.agent.createBackend(backend, dict(initParams or {}))
        self.backend_options[backend], self.backend_mems[backend] = self.agent.getBackendParams(
            self.backends[backend])

    def _plugin(self, backend):
        """(parameters, memory types) of a plugin; ({}, []) for an unknown one (a warning)."""
        if backend not in self.plugin_list:
            log.warning("xfer.nixl: no plugin %s (xfer.nixl offers %s)", backend, self.plugin_list)
            return {}, []
        return self.agent.getPluginParams(backend)

    def get_plugin_mem_types(self, backend):
        return self._plugin(backend)[1]

    def get_plugin_params(self, backend):
        return self._plugin(backend)[0]

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(backend, []))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(backend, {}))

    def _handles(self, backends):
        """The handles of backend names (KeyError for one this agent did not create)."""
        return [self.backends[b] for b in backends or ()]

    # ------------------------------------------------------------ descriptors
    def get_reg_descs(self, descs, mem_type=None, *, is_sorted=False):
        """An nixlRegDList from (addr, len, dev, meta) tuples, an (N, 3) array (with mem_type),
        tensors, or an nixlRegDList (itself); None, with a log line, for what cannot be read;
        KeyError for an unknown mem_type."""
        return _descs(descs, mem_type, nixlRegDList)

    def get_xfer_descs(self, descs, mem_type=None, *, is_sorted=False):
        """An nixlXferDList from (addr, len, dev) tuples, an (N, 3) array (with mem_type),
        tensors, or an nixlXferDList (itself); None, with a log line, for what cannot be read;
        KeyError for an unknown mem_type."""
        return _descs(descs, mem_type, nixlXferDList)

    def get_remote_descs(self, descs, mem_type=None):
        """An nixlRemoteDList from (addr, len, dev, agent name) tuples, or one (itself)."""
        if isinstance(descs, nixlRemoteDList):
            return descs
        if not isinstance(descs, (list, tuple)) or not descs or not isinstance(descs[0], tuple):
            return None
        if mem_type is None or len(descs[0]) != 4:
            log.error("remote descriptors are (addr, len, dev, agent name) tuples with a mem_type")
            return None
        return nixlRemoteDList(_MEMS[mem_type], list(descs))

    def get_serialized_descs(self, descs):
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        return pickle.loads(serialized_descs)

    # ------------------------------------------------------------ memory
    def register_memory(self, reg_list, mem_type=None, backends=None, *, is_sorted=False):
        """Registers the descriptors (all or nothing); returns their nixlRegDList.
        nixlInvalidParamError when they cannot be read."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlBind.nixlInvalidParamError("register_memory: the descriptors cannot be read")
        self.agent.registerMem(descs, self._handles(backends))
        return descs

    def deregister_memory(self, dereg_list, backends=None):
        self.agent.deregisterMem(dereg_list, self._handles(backends))

    def query_memory(self, reg_list, backend, mem_type=None):
        """POSIX: per descriptor, its file's {"size", "mode", "mtime"}, or None. ValueError for a
        backend this agent did not create."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends)}")
        if descs is None:
            raise nixlBind.nixlInvalidParamError("query_memory: the descriptors cannot be read")
        return self.agent.queryMem(descs, self.backends[backend])

    # ------------------------------------------------------------ metadata
    def get_agent_metadata(self):
        return self.agent.getLocalMD()

    def get_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None):
        """Metadata that gives the loading agent only these registered descriptors (it refuses
        others, as NIXL does), and, with inc_conn_info, how to reach this agent."""
        return self.agent.getLocalPartialMD(descs, inc_conn_info, self._handles(backends))

    def add_remote_agent(self, metadata):
        """Loads a peer's get_agent_metadata() (or partial metadata); returns its name (bytes,
        as NIXL does)."""
        return self.agent.loadRemoteMD(metadata)

    def remove_remote_agent(self, agent):
        self.agent.invalidateRemoteMD(_name(agent))

    def get_listen_port(self):
        """xfer's: the port the agent listens on (the metadata listener's, when enabled)."""
        return self.agent.listenPort()

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.sendLocalMD(ip_addr, port)

    def send_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None, ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        self.agent.sendLocalPartialMD(descs, inc_conn_info, self._handles(backends), ip_addr, port, label)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        self.agent.fetchRemoteMD(_name(remote_agent), ip_addr, port, label)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.invalidateLocalMD(ip_addr, port)

    def check_remote_metadata(self, agent, descs=None):
        """True once the agent's metadata came and, when descs (an nixlXferDList) are given,
        they are memory of the agent that this one may reach."""
        descs = nixlXferDList(nixlBind.DRAM_SEG) if descs is None else descs
        return self.agent.checkRemoteMD(_name(agent), descs) == nixlBind.NIXL_SUCCESS

    def make_connection(self, remote_agent, backends=None):
        self.agent.makeConnection(_name(remote_agent), self._handles(backends))

    # ------------------------------------------------------------ transfers
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=None, *, is_sorted=False):
        """A prepared list of descriptors of an agent's memory ("NIXL_INIT_AGENT" or "": this
        agent's, as a local side; this agent's own name: loopback)."""
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlBind.nixlInvalidParamError("prep_xfer_dlist: the descriptors cannot be read")
        name = _name(agent_name)
        if name in ("", "NIXL_INIT_AGENT"):
            handle = self.agent.prepXferDlist(descs, self._handles(backends))
        else:
            handle = self.agent.prepXferDlist(name, descs, self._handles(backends))
        return nixl_prepped_dlist_handle(self.agent, handle)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=None, skip_desc_merge=False):
        op = _OPS[operation]  # (KeyError first, as NIXL)
        handle = self.agent.makeXferReq(op, _handle_of(local_xfer_side), local_indices,
                                        _handle_of(remote_xfer_side), remote_indices, notif_msg,
                                        self._handles(backends), skip_desc_merge)
        return nixl_xfer_handle(self.agent, handle)

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"",
                        backends=None):
        op = _OPS[operation]  # (KeyError first, as NIXL)
        handle = self.agent.createXferReq(op, local_descs, remote_descs, _name(remote_agent), notif_msg,
                                          self._handles(backends))
        return nixl_xfer_handle(self.agent, handle)

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer: "DONE" when it completed at once, else "PROC" (failures raise)."""
        return _STATES.get(self.agent.postXferReq(_handle_of(handle), notif_msg), "ERR")

    def check_xfer_state(self, handle):
        return _STATES.get(self.agent.getXferStatus(_handle_of(handle)), "ERR")

    def get_xfer_telemetry(self, handle):
        return self.agent.getXferTelemetry(_handle_of(handle))

    def query_xfer_backend(self, handle):
        backend = self.agent.queryXferBackend(_handle_of(handle))
        return next(name for name, h in self.backends.items() if h == backend)

    def estimate_xfer_cost(self, req_handle):
        """(duration µs, error margin µs, method): see nixlAgent.estimateXferCost."""
        duration, margin, method = self.agent.estimateXferCost(_handle_of(req_handle))
        return duration, margin, ("ANALYTICAL_BACKEND" if method == nixlBind.NIXL_COST_ANALYTICAL_BACKEND
                                  else "UNKNOWN")

    def release_xfer_handle(self, handle):
        handle.release()

    def release_dlist_handle(self, handle):
        handle.release()

    def prep_mem_view(self, dlist, *, backends=None):
        return self.agent.prepMemView(dlist, self._handles(backends))

    def release_mem_view(self, mvh):
        self.agent.releaseMemView(mvh)

    # ------------------------------------------------------------ notifications
    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        self.agent.genNotif(_name(remote_agent_name), notif_msg, self._handles([backend] if backend else []))

    def get_new_notifs(self, backends=None):
        """{agent name: [message, ...]}: what came since the last call (or update_notifs)."""
        return self.agent.getNotifs({}, self._handles(backends))

    def update_notifs(self, backends=None):
        with self._notif_lock:
            self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
            return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None, tag_is_prefix=True):
        """True once a notification from that agent starts with lookup_tag (or, tag_is_prefix
        False, contains it); that one message is taken."""
        with self._notif_lock:
            self.update_notifs(backends)
            msgs = self.notifs.get(_name(remote_agent_name), [])
            return _take_matching(msgs, lookup_tag, tag_is_prefix) is not None

    # xfer's addition: NIXL tells a target nothing of a transfer that failed.
    def get_failed_notifs(self):
        """{agent name: [FailedNotif(message, outcome, landed), ...]}: the transfers toward this
        agent that did not complete, since the last call. outcome: "FAILED", "TIMED_OUT",
        "CANCELED" or "INITIATOR_LOST" (the initiator's agent died or went away first); landed:
        the positions of the transfer's descriptors whose bytes all landed (none known for
        INITIATOR_LOST). Their messages never reach get_new_notifs. (XFER_NIXL_NOTIFY_OUTCOMES=1)"""
        with self._notif_lock:
            self._collect_failed()
            got, self._failed = self._failed, {}
            return got

    def check_remote_xfer_state(self, remote_agent_name, lookup_tag, tag_is_prefix=True):
        """check_remote_xfer_done with check_xfer_state's answers: "DONE" once that agent's
        transfer with this notification completed, "ERR" once it ended otherwise (failed, timed
        out, canceled, its initiator lost), else "PROC". The notification found is taken."""
        with self._notif_lock:
            if self.check_remote_xfer_done(remote_agent_name, lookup_tag, tag_is_prefix=tag_is_prefix):
                return "DONE"
            self._collect_failed()
            mine = self._failed.get(_name(remote_agent_name), [])
            i = _take_matching([f.message for f in mine], lookup_tag, tag_is_prefix)
            if i is not None:
                del mine[i]
                if not mine:  # (get_failed_notifs lists agents with failures only)
                    self._failed.pop(_name(remote_agent_name), None)
                return "ERR"
            return "PROC"

    def _collect_failed(self):
        with self._notif_lock:
            for name, failed in self.agent.takeFailedNotifs().items():
                self._failed.setdefault(name, []).extend(failed)


def _handle_of(handle):
    """The low-level agent's int of a nixl_agent handle (or the int itself)."""
    return getattr(handle, "_handle", handle)


def _descs(descs, mem_type, cls):
    """NIXL's reading of descs as a cls list (see get_xfer_descs)."""
    if isinstance(descs, (nixlRegDList, nixlXferDList)):
        if isinstance(descs, cls):
            return descs
        log.error("an %s cannot be read as an %s", type(descs).__name__, cls.__name__)
        return None
    tensors = _tensors(descs)
    if tensors is not None:
        return _tensor_descs(tensors, cls)
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            log.error("descriptors in an array are its rows (addr, len, dev): (N, 3), not %s", descs.shape)
            return None
        return _list_of(cls, mem_type, descs)
    if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple):
        width = 4 if cls is nixlRegDList else 3
        if mem_type is not None and len(descs[0]) != width:
            log.error("%s descriptors are %d-tuples, not %r", cls.__name__, width, descs[0])
            return None
        return _list_of(cls, mem_type, list(descs))
    if isinstance(descs, (list, tuple)) and not descs:
        return _list_of(cls, mem_type, [])
    log.error("descriptors are tuples, an (N, 3) array, tensors or a descriptor list, not %s",
              type(descs).__name__)
    return None


def _list_of(cls, mem_type, rows):
    """cls(mem_type's segment, rows); None (a log line) without mem_type or for bad values."""
    if mem_type is None:
        log.error("give a mem_type (\"DRAM\", \"VRAM\"...) with descriptors that are not tensors")
        return None
    mem = _MEMS[mem_type]  # (KeyError for an unknown one, as NIXL)
    try:
        return cls(mem, rows)
    except (ValueError, TypeError, OverflowError) as e:
        log.error("cannot read the descriptors: %s", e)
        return None


def _tensor_descs(tensors, cls):
    if any(t.device != tensors[0].device for t in tensors):
        log.error("tensors must be on one device")
        return None
    if not all(t.is_contiguous() for t in tensors):
        log.error("tensors must be contiguous")
        return None
    dev = tensors[0].get_device()
    rows = np.array([(t.data_ptr(), t.numel() * t.element_size(), max(dev, 0)) for t in tensors], np.uint64)
    return cls(nixlBind.DRAM_SEG if dev < 0 else nixlBind.VRAM_SEG, rows)


def _tensors(descs):
    """descs as a list of torch tensors, or None when it is not tensors (torch is not imported
    for this: a tensor exists only when its caller imported torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(descs, torch.Tensor):
        return [descs]
    if isinstance(descs, (list, tuple)) and descs and all(isinstance(t, torch.Tensor) for t in descs):
        return list(descs)
    return None


def _take_matching(messages, tag, tag_is_prefix):
    """The index of the first message that starts with tag (or contains it), removed from
    messages; None when none does."""
    tag = _bytes(tag)
    for i, m in enumerate(messages):
        if m.startswith(tag) if tag_is_prefix else tag in m:
            del messages[i]
            return i
    return None
