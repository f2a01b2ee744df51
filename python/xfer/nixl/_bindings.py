"""NIXL's nixl._bindings (a C++ extension in NIXL): the enums and constants, the exceptions, the
descriptor lists, and the low-level agent (nixlAgent, nixlAgentConfig; in _agent) that
nixl._api.nixl_agent is built on."""

import datetime
import enum

import numpy as np

NIXL_INIT_AGENT = ""
DEFAULT_COMM_PORT = 8888
# prep_mem_view needs UCX's GPU device API; xfer.nixl has no such path (nixlAgent.prepMemView).
HAVE_UCX_GPU_DEVICE_API = False

__all__ = [
    "NIXL_INIT_AGENT", "DEFAULT_COMM_PORT", "HAVE_UCX_GPU_DEVICE_API", "nixl_mem_t", "DRAM_SEG",
    "VRAM_SEG", "BLK_SEG", "OBJ_SEG", "FILE_SEG", "nixl_xfer_op_t", "NIXL_READ", "NIXL_WRITE",
    "nixl_thread_sync_t", "NIXL_THREAD_SYNC_NONE", "NIXL_THREAD_SYNC_STRICT", "NIXL_THREAD_SYNC_RW",
    "NIXL_THREAD_SYNC_DEFAULT", "nixl_status_t", "NIXL_IN_PROG", "NIXL_SUCCESS", "NIXL_ERR_NOT_POSTED",
    "NIXL_ERR_INVALID_PARAM", "NIXL_ERR_BACKEND", "NIXL_ERR_NOT_FOUND", "NIXL_ERR_MISMATCH",
    "NIXL_ERR_NOT_ALLOWED", "NIXL_ERR_REPOST_ACTIVE", "NIXL_ERR_UNKNOWN", "NIXL_ERR_NOT_SUPPORTED",
    "NIXL_ERR_REMOTE_DISCONNECT", "NIXL_ERR_CANCELED", "NIXL_ERR_NO_TELEMETRY", "nixl_cost_t",
    "NIXL_COST_ANALYTICAL_BACKEND", "nixlNotPostedError", "nixlInvalidParamError",
    "nixlBackendError", "nixlNotFoundError", "nixlMismatchError", "nixlNotAllowedError",
    "nixlRepostActiveError", "nixlUnknownError", "nixlNotSupportedError",
    "nixlRemoteDisconnectError", "nixlCancelledError", "nixlNoTelemetryError",
    "nixlXferDList", "nixlRegDList", "nixlRemoteDList", "nixlXferTelemetry", "nixlAgentConfig",
    "nixlAgent",
]


class _Enum(enum.IntEnum):
    """As NIXL's (pybind11) enums: equal to and hashed as their integer; str() names the type and
    the member (an IntEnum's str() would be the bare number)."""

    __str__ = enum.Enum.__str__


class nixl_mem_t(_Enum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG = nixl_mem_t


class nixl_xfer_op_t(_Enum):
    NIXL_READ = 0
    NIXL_WRITE = 1


NIXL_READ, NIXL_WRITE = nixl_xfer_op_t


class nixl_thread_sync_t(_Enum):
    """nixlAgentConfig.syncMode. Checked and kept, not needed: an xfer.nixl agent is safe to call
    from several threads whatever the mode. DEFAULT is NONE (as in NIXL)."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT


class nixl_status_t(_Enum):
    """What nixlAgent's methods return (errors are raised as the exceptions below instead)."""

    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


(NIXL_IN_PROG, NIXL_SUCCESS, NIXL_ERR_NOT_POSTED, NIXL_ERR_INVALID_PARAM, NIXL_ERR_BACKEND,
 NIXL_ERR_NOT_FOUND, NIXL_ERR_MISMATCH, NIXL_ERR_NOT_ALLOWED, NIXL_ERR_REPOST_ACTIVE, NIXL_ERR_UNKNOWN,
 NIXL_ERR_NOT_SUPPORTED, NIXL_ERR_REMOTE_DISCONNECT, NIXL_ERR_CANCELED, NIXL_ERR_NO_TELEMETRY) = nixl_status_t


class nixl_cost_t(_Enum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


NIXL_COST_ANALYTICAL_BACKEND = nixl_cost_t.NIXL_COST_ANALYTICAL_BACKEND


# ---------------------------------------------------------------- exceptions
class _NixlError(Exception):
    """Base of the exceptions below (NIXL's derive from Exception). str(): the NIXL status
    name, then xfer's reason."""

    status = "NIXL_ERR_UNKNOWN"

    def __init__(self, reason=""):
        super().__init__(f"{self.status}: {reason}" if reason else self.status)


def _error(name, status):
    cls = type(name, (_NixlError,), {"status": status, "__module__": __name__})
    globals()[name] = cls
    return cls


nixlNotPostedError = _error("nixlNotPostedError", "NIXL_ERR_NOT_POSTED")
nixlInvalidParamError = _error("nixlInvalidParamError", "NIXL_ERR_INVALID_PARAM")
nixlBackendError = _error("nixlBackendError", "NIXL_ERR_BACKEND")
nixlNotFoundError = _error("nixlNotFoundError", "NIXL_ERR_NOT_FOUND")
nixlMismatchError = _error("nixlMismatchError", "NIXL_ERR_MISMATCH")
nixlNotAllowedError = _error("nixlNotAllowedError", "NIXL_ERR_NOT_ALLOWED")
nixlRepostActiveError = _error("nixlRepostActiveError", "NIXL_ERR_REPOST_ACTIVE")
nixlUnknownError = _error("nixlUnknownError", "NIXL_ERR_UNKNOWN")
nixlNotSupportedError = _error("nixlNotSupportedError", "NIXL_ERR_NOT_SUPPORTED")
nixlRemoteDisconnectError = _error("nixlRemoteDisconnectError", "NIXL_ERR_REMOTE_DISCONNECT")
nixlCancelledError = _error("nixlCancelledError", "NIXL_ERR_CANCELED")
nixlNoTelemetryError = _error("nixlNoTelemetryError", "NIXL_ERR_NO_TELEMETRY")


# ---------------------------------------------------------------- descriptor lists
def _mem(t):
    return nixl_mem_t(int(t))


class _DList:
    """Descriptors of one memory type: rows (addr, len, devId) in an (N, 3) uint64 array."""

    _width = 3

    def __init__(self, type, descs=0):
        self._type = _mem(type)
        self._rows = np.zeros((0, 3), np.uint64)
        self._metas = []
        if isinstance(descs, int):
            return
        if isinstance(descs, np.ndarray):
            if descs.ndim != 2 or descs.shape[1] != 3:
                raise ValueError(f"descriptors must be an (N, 3) array, not {descs.shape}")
            self._rows = _rows(descs)
            self._metas = [b""] * len(descs)
            return
        descs = list(descs)
        for t in descs:
            self._check(t)
        self._rows = _rows([t[:3] for t in descs])
        self._metas = [_meta(t[3]) for t in descs] if self._width == 4 else [b""] * len(descs)

    def _check(self, t):
        if not isinstance(t, tuple):
            raise TypeError(f"each descriptor is a tuple, not {type(t).__name__}")
        if len(t) != self._width:
            raise ValueError(f"a descriptor here is a {self._width}-tuple, not {t!r}")

    def __bool__(self):
        return True  # (as NIXL's: an empty list is still a list)

    def append(self, t):
        self._check(t)
        self._rows = np.vstack([self._rows, _rows([t[:3]])])
        self._metas.append(_meta(t[3]) if self._width == 4 else b"")

    addDesc = append

    def getType(self):
        return self._type

    def descCount(self):
        return len(self._rows)

    def isEmpty(self):
        return len(self._rows) == 0

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, i):
        row = tuple(int(v) for v in self._rows[i])
        return row + (self._metas[i],) if self._width == 4 else row

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def index(self, t):
        for i, d in enumerate(self):
            if d[:3] == tuple(t[:3]):
                return i
        raise nixlNotFoundError(f"descriptor {t!r} is not in the list")

    def remDesc(self, i):
        self._rows = np.delete(self._rows, i, axis=0)
        del self._metas[i]

    def clear(self):
        self._rows = np.zeros((0, 3), np.uint64)
        self._metas = []

    def __eq__(self, other):
        return (type(self) is type(other) and self._type == other._type and
                np.array_equal(self._rows, other._rows) and self._metas == other._metas)

    def __repr__(self):
        return f"{type(self).__name__}({self._type.name}, {len(self)} descriptors)"

    def print(self):
        print(repr(self), *(self[i] for i in range(len(self))), sep="\n  ")


def _rows(values):
    """(N, 3) uint64 rows from integers, refusing negative ones (ValueError)."""
    rows = np.asarray(values)
    if len(rows) == 0:
        return np.zeros((0, 3), np.uint64)
    if rows.dtype.kind not in "iu" or rows.ndim != 2 or rows.shape[1] != 3:
        raise ValueError("descriptors are rows of three integers (addr, len, devId)")
    if rows.dtype.kind == "i" and (rows < 0).any():
        raise ValueError("a descriptor has a negative address, length or device")
    return rows.astype(np.uint64)


def _meta(m):
    return m.encode() if isinstance(m, str) else bytes(m)


class nixlXferDList(_DList):
    """Descriptors to transfer: (addr, len, devId)."""


class nixlRegDList(_DList):
    """Descriptors to register: (addr, len, devId, meta)."""

    _width = 4

    def trim(self):
        """The same descriptors as an nixlXferDList (meta dropped)."""
        out = nixlXferDList(self._type)
        out._rows = self._rows.copy()
        out._metas = [b""] * len(self._rows)
        return out


class nixlRemoteDList(_DList):
    """Descriptors of other agents' memory: (addr, len, devId, agent name); prep_mem_view's input
    (which xfer.nixl does not offer: see nixlAgent.prepMemView)."""

    _width = 4

    def __getitem__(self, i):
        addr, length, dev, name = super().__getitem__(i)
        return addr, length, dev, name.decode()


class nixlXferTelemetry:
    """A transfer's times (µs) and size, as get_xfer_telemetry gives them."""

    def __init__(self, startTime=0, postDuration=0, xferDuration=0, totalBytes=0, descCount=0):
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self):
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, "
                f"descCount={self.descCount})")


class nixlAgentConfig:
    """The low-level agent's options (NIXL's nixlAgentConfig, positional order included).
    listenPort: where the metadata listener listens when useListenThread (0: a free port).
    useProgThread, pthrDelay, lthrDelay and etcdWatchTimeout are kept for NIXL code and not
    needed: xfer's engine runs its own threads. num_workers is taken and not kept, as NIXL's
    constructor takes it and keeps it nowhere (its config has no such attribute)."""

    def __init__(self, useProgThread=False, useListenThread=False, listenPort=DEFAULT_COMM_PORT,
                 syncMode=NIXL_THREAD_SYNC_DEFAULT, num_workers=1, pthrDelay=0, lthrDelay=100000,
                 captureTelemetry=False, etcdWatchTimeout=datetime.timedelta(seconds=5)):
        self.useProgThread = useProgThread
        self.useListenThread = useListenThread
        self.listenPort = listenPort
        self.syncMode = syncMode
        self.pthrDelay = pthrDelay
        self.lthrDelay = lthrDelay
        self.captureTelemetry = captureTelemetry
        self.etcdWatchTimeout = etcdWatchTimeout

    def __repr__(self):
        return f"nixlAgentConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


from ._agent import nixlAgent  # noqa: E402  (it uses the names above)
