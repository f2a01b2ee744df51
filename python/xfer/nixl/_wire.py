"""What xfer.nixl agents say to each other, over their engines' notifications: the agent
metadata, and the notifications of NIXL code, each framed with the sender's agent name (an
engine knows its peers by address; NIXL code knows them by agent name).

A frame: MAGIC, one kind byte, the sender's name (2-byte length, little-endian), the payload.
A notification without MAGIC (from a plain xfer engine) is kept under its sender's address."""

import collections
import enum
import fcntl
import json
import logging
import socket
import struct
import threading

import numpy as np

from .. import InvalidArgumentError, Outcome, XferError

log = logging.getLogger("xfer.nixl")

MAGIC = b"xfer-nixl\0"
NOTIFY_BYTES = 1 << 20  # the engine's bound on a notification, frame included (notify_max_message_bytes)
CONNECT_TIMEOUT = 10.0  # seconds (the notification thread connects to answer a request)


# A transfer toward this agent that did not complete (xfer's notify.outcomes): its
# notification's message, how it ended ("FAILED", "TIMED_OUT", "CANCELED", "INITIATOR_LOST"),
# and the positions of the descriptors that landed whole.
FailedNotif = collections.namedtuple("FailedNotif", "message outcome landed")


class Message(bytes, enum.Enum):
    NOTIF = b"N"     # NIXL code's notification
    METADATA = b"M"  # the sender's metadata (whole or partial): load it
    ASK = b"A"       # answer with METADATA: the metadata served under the label in the payload
    FORGET = b"F"    # forget the sender


def frame(kind, sender, payload=b""):
    name = sender.encode()
    return MAGIC + kind.value + struct.pack("<H", len(name)) + name + payload


def unframe(data):
    """(kind, sender, payload), or None when data is not a frame."""
    head = len(MAGIC) + 3
    if not data.startswith(MAGIC) or len(data) < head:
        return None
    try:
        kind = Message(data[len(MAGIC):len(MAGIC) + 1])
    except ValueError:
        return None
    (n,) = struct.unpack_from("<H", data, len(MAGIC) + 1)
    if len(data) < head + n:
        return None
    return kind, data[head:head + n].decode(errors="replace"), data[head + n:]


def host_address():
    """The IPv4 address of the interface that holds the default route (127.0.0.1 when none):
    where peers on other hosts can reach this one."""
    try:
        with open("/proc/net/route") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1] == "00000000":  # the default route
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    try:
                        req = struct.pack("256s", fields[0][:15].encode())
                        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
                    finally:
                        s.close()
    except OSError:
        pass
    return "127.0.0.1"


class Agents:
    """The agents this one knows (name -> engine address, and the memory of theirs whose
    metadata came), and a thread that takes the engine's notifications as they come: metadata at
    once, NIXL code's kept for the taking.

    Metadata (get_agent_metadata's bytes): MAGIC, then JSON {"name", "address", "regions"}.
    regions: null in whole metadata (every region the agent registers, now or later, as xfer's
    engine gives a peer); a list of [addr, len] in partial metadata (only those: NIXL refuses
    descriptors outside the partial metadata it was sent, and so does this agent; kept as a
    region_table, see outside()). address is
    left out of partial metadata sent without connection info: it then adds to an agent known
    already. Labels: metadata served to agents that ask (ASK) under a label (etcd's flow)."""

    def __init__(self, engine, name):
        self._engine, self._name = engine, name
        self._lock = threading.Lock()
        self._by_name = {}
        self._exposed = {}  # name -> None (whole metadata loaded) or a region_table (partial only)
        self._served = {}   # label -> metadata bytes, for ASK
        self._waiting = {}  # label -> {address}: asked before the label was served
        self._inbox = {}
        self._failed = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"xfer.nixl {name}", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if threading.current_thread() is not self._thread:  # (a collection on this thread)
            self._thread.join()

    def metadata(self, regions=None, with_address=True):
        """This agent's metadata: whole (regions None), or partial: regions [(addr, len)]."""
        md = {"name": self._name, "regions": None if regions is None else [list(r) for r in regions]}
        if with_address or regions is None:
            md["address"] = self._engine.name
        return MAGIC + json.dumps(md).encode()

    def load(self, metadata):
        """Remembers the agent whose metadata this is, connects to it; returns its name.
        ValueError: not metadata; KeyError: partial metadata without connection info from an
        agent not known yet."""
        name, address, regions = _parse(metadata)
        if address is None:
            address = self.address(name)
            if address is None:
                raise KeyError(f"partial metadata of agent {name!r} has no connection info, and "
                               "no metadata of that agent was loaded before")
        self.connect(address)
        with self._lock:
            # (metadata adds to what came before from the same agent; an agent at another
            # address is another instance of it: what came before is forgotten)
            same = self._by_name.get(name) == address
            prior = self._exposed.get(name, _NO_REGIONS) if same else _NO_REGIONS
            self._by_name[name] = address
            self._exposed[name] = (None if regions is None or prior is None
                                   else region_table(regions, prior))
        return name

    def exposed(self, name):
        """None: every region of the agent is known (whole metadata); else the region_table
        of what its partial metadata gave (not to be changed: a load replaces it)."""
        with self._lock:
            return self._exposed.get(name)

    def serve(self, label, metadata):
        """Serves metadata under label to the agents that ask (those waiting for it included)."""
        with self._lock:
            self._served[label] = metadata
            waiting = self._waiting.pop(label, set())
        for address in waiting:
            self._answer(address, label)

    def remember(self, name, address):
        """An agent found elsewhere (etcd), connected already."""
        with self._lock:
            self._by_name[name] = address
            self._exposed[name] = None

    def address(self, name):
        with self._lock:
            return self._by_name.get(name)

    def forget(self, name):
        """Forgets the agent and disconnects; False when it was not known."""
        with self._lock:
            address = self._by_name.pop(name, None)
            self._exposed.pop(name, None)
        if address is not None:
            try:
                self._engine.disconnect(address)
            except XferError:
                pass  # (not connected, or gone: nothing to undo)
        return address is not None

    def tell(self, address, kind, payload=None):
        """Sends the agent at address a frame of kind; METADATA's payload: our whole metadata
        unless given."""
        self.connect(address)
        if payload is None:
            payload = self.metadata() if kind == Message.METADATA else b""
        self._engine.send_notify(address, frame(kind, self._name, payload))

    def tell_all(self, kind):
        with self._lock:
            addresses = list(self._by_name.values())
        for a in addresses:
            try:
                self.tell(a, kind)
            except XferError as e:
                log.info("xfer.nixl: could not tell %s: %s", a, e)

    def framed(self, message):
        """NIXL code's notification as it goes on the wire; one that the engine's bound
        (NOTIFY_BYTES) cannot carry with its frame raises InvalidArgumentError, saying how much
        it may be."""
        framed = frame(Message.NOTIF, self._name, message)
        if len(framed) > NOTIFY_BYTES:
            most = NOTIFY_BYTES - (len(framed) - len(message))
            raise InvalidArgumentError(
                f"notification of {len(message)} bytes: at most {most} here (1 MiB less this drop-in's "
                f"frame of {len(framed) - len(message)} bytes, with the agent's name)")
        return framed

    def notify(self, address, message):
        self._engine.send_notify(address, self.framed(message))

    def take_notifs(self):
        with self._lock:
            got, self._inbox = self._inbox, {}
        return got

    def take_failed(self):
        with self._lock:
            got, self._failed = self._failed, {}
        return got

    def connect(self, address):
        """Connects to address (nothing when connected already)."""
        try:
            self._engine.connect(address, CONNECT_TIMEOUT)
        except XferError as e:
            if e.code != "ALREADY_CONNECTED":
                raise

    def _run(self):
        while not self._stop.is_set():
            try:
                got = self._engine.wait_notifies(0.1)
            except XferError as e:
                if self._engine.closed:
                    return
                log.warning("xfer.nixl: taking notifications failed: %s", e)
                self._stop.wait(0.1)
                continue
            for n in got:
                try:
                    self._take(n)
                except Exception as e:  # (one bad message must not end the thread)
                    log.warning("xfer.nixl: a message from %s was dropped: %s", n.sender, e)

    def _take(self, n):
        framed = unframe(n.message)
        kind, sender, payload = framed if framed is not None else (Message.NOTIF, n.sender, n.message)
        if kind == Message.NOTIF:
            with self._lock:
                if n.outcome == Outcome.COMPLETED:
                    self._inbox.setdefault(sender, []).append(payload)
                else:  # (NIXL code that reads get_new_notifs only never sees it: its data did not all land)
                    failed = FailedNotif(payload, n.outcome.name, list(n.landed))
                    self._failed.setdefault(sender, []).append(failed)
        elif kind == Message.METADATA:
            try:
                self.load(payload)
            except (ValueError, KeyError, XferError) as e:
                log.warning("xfer.nixl: metadata from %s not loaded: %s", n.sender, e)
        elif kind == Message.ASK:
            self._answer(n.sender, payload.decode(errors="replace"))
        elif kind == Message.FORGET:
            with self._lock:
                if self._by_name.get(sender) == n.sender:
                    del self._by_name[sender]
                    self._exposed.pop(sender, None)

    def _answer(self, address, label):
        """Sends the metadata served under label (no label: the whole metadata) to address; a
        label not served yet is answered once it is."""
        with self._lock:
            metadata = self._served.get(label)
            if metadata is None and label:
                self._waiting.setdefault(label, set()).add(address)
                return
        try:
            self.tell(address, Message.METADATA, metadata)
        except XferError as e:
            log.warning("xfer.nixl: could not answer %s's request for metadata: %s", address, e)


def region_table(regions, more=None):
    """Memory regions [(addr, len)] (with the rows of the region_table more) as a region_table:
    (M, 2) uint64 rows (start, end), sorted by start, without the rows that lie inside another
    (the same region sent again, say). Their ends then grow with their starts, so a descriptor
    lies within one region exactly when it lies within the last row starting at or before it,
    which outside() finds with a binary search. (Touching or overlapping regions are not merged
    into one: a descriptor across two of them is not within one region, which NIXL refuses.)"""
    rows = np.array([(a, a + n) for a, n in regions], np.uint64).reshape(-1, 2)
    if more is not None:
        rows = np.concatenate([rows, more])
    if len(rows) < 2:
        return rows
    rows = rows[np.lexsort((np.iinfo(np.uint64).max - rows[:, 1], rows[:, 0]))]  # start up, end down
    ends = rows[:, 1]
    keep = np.ones(len(rows), bool)
    keep[1:] = ends[1:] > np.maximum.accumulate(ends)[:-1]  # (else inside an earlier row)
    return rows[keep]


_NO_REGIONS = region_table([])


def outside(table, rows):
    """For descriptor rows (addr, len, ...) (an (N, >=2) integer array), whether each does not
    lie within one region of the region_table: a boolean array."""
    addr = np.asarray(rows[:, 0], np.uint64)
    end = addr + np.asarray(rows[:, 1], np.uint64)
    i = np.searchsorted(table[:, 0], addr, side="right") - 1  # the last row starting at or before addr
    inside = (i >= 0) & (end >= addr)  # (end < addr: the length wrapped around)
    if len(table):
        inside &= end <= table[np.maximum(i, 0), 1]
    return ~inside


def _parse(metadata):
    """(name, address or None, regions or None) of get_agent_metadata's bytes; ValueError when
    they are not an xfer.nixl agent's metadata."""
    try:
        data = bytes(metadata)
        md = json.loads(data[len(MAGIC):]) if data.startswith(MAGIC) else None
        name, address, regions = md["name"], md.get("address"), md.get("regions")
        if regions is not None:
            regions = [(int(a), int(n)) for a, n in regions]
            if not all(0 <= a and 0 <= n and a + n < 1 << 64 for a, n in regions):
                raise ValueError
        if isinstance(name, str) and name and (address is None or isinstance(address, str)):
            return name, address, regions
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    raise ValueError("not the metadata of an xfer.nixl agent (get_agent_metadata)")
