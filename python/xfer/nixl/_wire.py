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

from .. import Outcome, XferError

log = logging.getLogger("xfer.nixl")

MAGIC = b"xfer-nixl\0"
CONNECT_TIMEOUT = 10.0  # seconds (the notification thread connects to answer a request)


# A transfer toward this agent that did not complete (xfer's notify.outcomes): its
# notification's message, how it ended ("FAILED", "TIMED_OUT", "CANCELED", "INITIATOR_LOST"),
# and the positions of the descriptors that landed whole.
FailedNotif = collections.namedtuple("FailedNotif", "message outcome landed")


class Message(bytes, enum.Enum):
    NOTIF = b"N"     # NIXL code's notification
    METADATA = b"M"  # the sender's metadata: remember its name and address
    ASK = b"A"       # answer with METADATA
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
    """The agents this one knows (name -> engine address), and a thread that takes the
    engine's notifications as they come: metadata at once, NIXL code's kept for the taking."""

    def __init__(self, engine, name):
        self._engine, self._name = engine, name
        self._lock = threading.Lock()
        self._by_name = {}
        self._inbox = {}
        self._failed = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"xfer.nixl {name}", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if threading.current_thread() is not self._thread:  # (a collection on this thread)
            self._thread.join()

    def metadata(self):
        return MAGIC + json.dumps({"name": self._name, "address": self._engine.name}).encode()

    def load(self, metadata):
        """Remembers the agent whose metadata this is, connects to it; returns its name."""
        try:
            md = json.loads(bytes(metadata)[len(MAGIC):]) if bytes(metadata).startswith(MAGIC) else None
            name, address = md["name"], md["address"]
            if not isinstance(name, str) or not isinstance(address, str):
                md = None
        except (ValueError, TypeError, KeyError):
            md = None
        if md is None:
            raise ValueError("not the metadata of an xfer.nixl agent (get_agent_metadata)")
        self.connect(address)
        with self._lock:
            self._by_name[name] = address
        return name

    def remember(self, name, address):
        """An agent found elsewhere (etcd), connected already."""
        with self._lock:
            self._by_name[name] = address

    def address(self, name):
        with self._lock:
            return self._by_name.get(name)

    def forget(self, name):
        with self._lock:
            address = self._by_name.pop(name, None)
        if address is not None:
            try:
                self._engine.disconnect(address)
            except XferError:
                pass  # (not connected, or gone: nothing to undo)

    def tell(self, address, kind):
        """Sends the agent at address a frame of kind (our metadata with METADATA)."""
        self.connect(address)
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
        return frame(Message.NOTIF, self._name, message)

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
            except (ValueError, XferError) as e:
                log.warning("xfer.nixl: metadata from %s not loaded: %s", n.sender, e)
        elif kind == Message.ASK:
            try:
                self.tell(n.sender, Message.METADATA)
            except XferError as e:
                log.warning("xfer.nixl: could not answer %s's request for metadata: %s", sender, e)
        elif kind == Message.FORGET:
            with self._lock:
                if self._by_name.get(sender) == n.sender:
                    del self._by_name[sender]
