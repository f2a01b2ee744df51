"""NIXL's telemetry on xfer.nixl agents: which agents capture it (NIXL_TELEMETRY_ENABLE, when
set, over the config's captureTelemetry), and the per-agent event file that NIXL's
telemetry_reader.py reads: NIXL_TELEMETRY_DIR/<agent name>, a ring of (event type, value)
records in a file the agent maps and a reader maps too, laid out as NIXL lays it out:

    header (40 bytes, native order): write_pos u64, read_pos u64, version i32 (4),
        expected_version i32, capacity u64 (a power of 2), mask u64 (capacity - 1)
    capacity records (16 bytes): event type u32, 4 bytes of padding, value u64

The writer fills the records from write_pos on, then moves write_pos past them; the reader takes
the record at read_pos, then moves read_pos on; the ring is full when write_pos + 1 == read_pos
(mod capacity). Events go in as NIXL's queue takes them: one alone, or a transfer's four as one
batch, all or none; those that find no room are counted and told later as one
AGENT_TELEMETRY_EVENTS_DROPPED."""

import enum
import fnmatch
import logging
import mmap
import os
import struct
import threading

from . import _bindings as nb

log = logging.getLogger("xfer.nixl")

ENABLE_ENV = "NIXL_TELEMETRY_ENABLE"
DIR_ENV = "NIXL_TELEMETRY_DIR"
EXPORTER_ENV = "NIXL_TELEMETRY_EXPORTER"         # "BUFFER" (the file) or "NOP" (in-process only)
BUFFER_SIZE_ENV = "NIXL_TELEMETRY_BUFFER_SIZE"   # records in the ring (default 4096)
METRICS_ENV = "NIXL_TELEMETRY_ENABLED_METRICS"   # comma-separated globs of event names (default all)
VERSION = 4
DEFAULT_CAPACITY = 4096

_HEADER = struct.Struct("=QQiiQQ")
_EVENT = struct.Struct("=I4xQ")
_POSITIONS = struct.Struct("=QQ")
_TRUE = ("y", "yes", "on", "1", "true", "enable")
_FALSE = ("n", "no", "off", "0", "false", "disable")


class Event(enum.IntEnum):
    """NIXL's telemetry event types; str(): the name a reader prints (agent_tx_bytes...)."""

    AGENT_TX_BYTES = 0
    AGENT_RX_BYTES = 1
    AGENT_TX_REQUESTS_NUM = 2
    AGENT_RX_REQUESTS_NUM = 3
    AGENT_MEMORY_REGISTERED = 4
    AGENT_MEMORY_DEREGISTERED = 5
    AGENT_XFER_TIME = 6
    AGENT_XFER_POST_TIME = 7
    AGENT_ERR_NOT_POSTED = 8
    AGENT_ERR_INVALID_PARAM = 9
    AGENT_ERR_BACKEND = 10
    AGENT_ERR_NOT_FOUND = 11
    AGENT_ERR_MISMATCH = 12
    AGENT_ERR_NOT_ALLOWED = 13
    AGENT_ERR_REPOST_ACTIVE = 14
    AGENT_ERR_UNKNOWN = 15
    AGENT_ERR_NOT_SUPPORTED = 16
    AGENT_ERR_REMOTE_DISCONNECT = 17
    AGENT_ERR_CANCELED = 18
    AGENT_ERR_NO_TELEMETRY = 19
    AGENT_TELEMETRY_EVENTS_DROPPED = 20

    def __str__(self):
        return self.name.lower()


def env_flag(name):
    """The environment variable as NIXL reads a yes/no one: None when unset; ValueError naming
    the variable for a value that is neither."""
    value = os.environ.get(name)
    if value is None:
        return None
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: give one of {', '.join(_TRUE)} or {', '.join(_FALSE)}")


def for_agent(agent_name, capture):
    """The agent's Telemetry, or None when it captures none: NIXL_TELEMETRY_ENABLE decides when
    set (either way), else the config's capture flag."""
    flag = env_flag(ENABLE_ENV)
    if flag is False and capture:
        log.warning("xfer.nixl agent %s: %s is off; the config's capture_telemetry is ignored",
                    agent_name, ENABLE_ENV)
    if not (capture if flag is None else flag):
        return None
    return Telemetry(agent_name)


class Telemetry:
    """An agent's telemetry. Events go to the agent's file when NIXL_TELEMETRY_DIR is set (NIXL's
    BUFFER exporter), else nowhere (NOP); either way get_xfer_telemetry answers."""

    def __init__(self, agent_name):
        exporter = os.environ.get(EXPORTER_ENV) or ("BUFFER" if os.environ.get(DIR_ENV) else "NOP")
        self._on = _enabled_events()
        self._ring = None
        self.path = None
        if exporter == "BUFFER":
            if not os.environ.get(DIR_ENV):
                raise ValueError(f"{EXPORTER_ENV}=BUFFER writes to {DIR_ENV}, which is not set")
            self.path = os.path.join(os.environ[DIR_ENV], agent_name)
            self._ring = EventRing(self.path, _capacity())
        elif exporter != "NOP":
            raise nb.nixlNotSupportedError(f"{EXPORTER_ENV}={exporter!r}: xfer.nixl writes BUFFER "
                                           "(the file in NIXL_TELEMETRY_DIR) or NOP only")

    def transfer_done(self, write, nbytes, post_us, xfer_us):
        """A transfer completed: its post and transfer times (µs), bytes, and one request, as
        one batch (NIXL's addXferStats: a reader never sees part of a transfer)."""
        self._emit((Event.AGENT_XFER_POST_TIME, post_us), (Event.AGENT_XFER_TIME, xfer_us),
                   (Event.AGENT_TX_BYTES if write else Event.AGENT_RX_BYTES, nbytes),
                   (Event.AGENT_TX_REQUESTS_NUM if write else Event.AGENT_RX_REQUESTS_NUM, 1))

    def registered(self, nbytes):
        self._emit((Event.AGENT_MEMORY_REGISTERED, nbytes))

    def deregistered(self, nbytes):
        self._emit((Event.AGENT_MEMORY_DEREGISTERED, nbytes))

    def error(self, exc):
        """One more error of the exception's status (a nixl exception)."""
        status = getattr(exc, "status", "NIXL_ERR_UNKNOWN")
        self._emit((Event["AGENT_" + status[len("NIXL_"):]], 1))

    def _emit(self, *events):
        """Pushes the (event, value) pairs that are on, as one batch."""
        if self._ring is not None:
            batch = [(event, int(value)) for event, value in events if self._on[event]]
            if batch:
                self._ring.push(batch)

    def close(self):
        if self._ring is not None:
            self._ring.close()
            self._ring = None


def _capacity():
    raw = os.environ.get(BUFFER_SIZE_ENV, str(DEFAULT_CAPACITY))
    try:
        capacity = int(raw)
    except ValueError:
        capacity = 0
    if capacity <= 0 or capacity & (capacity - 1):
        raise ValueError(f"{BUFFER_SIZE_ENV}={raw!r}: the ring's records are a power of 2")
    return capacity


def _enabled_events():
    """{Event: on}: NIXL_TELEMETRY_ENABLED_METRICS's globs over the event names (all when unset)."""
    globs = {g.strip() for g in os.environ.get(METRICS_ENV, "").split(",") if g.strip()}
    on = {e: not globs or any(fnmatch.fnmatchcase(str(e), g) for g in globs) for e in Event}
    for g in globs:
        if not any(fnmatch.fnmatchcase(str(e), g) for e in Event):
            log.warning("xfer.nixl: %s entry %r matches no telemetry event; ignored", METRICS_ENV, g)
    return on


class EventRing:
    """The writer's side of the event file (see the module's text). push is thread-safe."""

    def __init__(self, path, capacity):
        self.capacity, self._mask = capacity, capacity - 1
        self._lock = threading.Lock()
        self._dropped = 0
        size = _HEADER.size + _EVENT.size * capacity
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _HEADER.pack_into(self._map, 0, 0, 0, VERSION, VERSION, capacity, self._mask)

    def push(self, events):
        """Adds the (event, value) records, all or none (as NIXL's queue takes a batch); False
        when the ring has no room for them all: then counted, and told as one
        AGENT_TELEMETRY_EVENTS_DROPPED once there is room."""
        with self._lock:
            if self._map is None:
                return False
            write, read = _POSITIONS.unpack_from(self._map, 0)
            if self._dropped and self._room(write, read):
                write = self._put(write, [(Event.AGENT_TELEMETRY_EVENTS_DROPPED, self._dropped)])
                self._dropped = 0
            if len(events) > self._room(write, read):
                self._dropped += len(events)
                return False
            self._put(write, events)
            return True

    def _room(self, write, read):
        """How many records fit (one slot stays free: write_pos == read_pos means empty)."""
        return self._mask - ((write - read) & self._mask)

    def _put(self, write, events):
        """Writes the records from write on, then moves write_pos past them (after the records:
        a reader sees whole ones, and a batch at once); the new write_pos."""
        for event, value in events:
            _EVENT.pack_into(self._map, _HEADER.size + _EVENT.size * write, int(event), value)
            write = (write + 1) & self._mask
        struct.pack_into("=Q", self._map, 0, write)
        return write

    def close(self):
        with self._lock:
            if self._map is not None:
                self._map.flush()
                self._map.close()
                self._map = None
