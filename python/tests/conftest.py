"""Fixtures: a peer process (peer.py) and the transports the tests run over."""

import http.server
import json
import os
import select
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

import xfer

HERE = os.path.dirname(os.path.abspath(__file__))

# How each transport is reached from this process: the peer's memory, the engines' options, and
# the route its bytes must be counted under (PeerInfo.moved).
TRANSPORTS = {
    "shm": dict(memory="alloc", options={}, route="shm"),
    "cma": dict(memory="register", options={}, route="cma"),
    "tcp": dict(memory="alloc", options={"transport": "tcp"}, route="tcp"),
    "ucx": dict(memory="alloc", options={"transport": "ucx"}, route="ucx"),
}


class Child:
    """A child process spoken to in JSON lines: send(obj), recv(timeout); every read is bounded
    (it reads the pipe itself: a buffered reader's lines are invisible to select), and close()
    always ends the process."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self._fd, self._buf = self.proc.stdout.fileno(), b""

    def line(self, timeout):
        """The next line of its output, or raises when none came within timeout seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            chunk = os.read(self._fd, 65536) if left > 0 and select.select([self._fd], [], [], left)[0] else b""
            if not chunk:
                self.kill()
                raise RuntimeError(f"{os.path.basename(self.proc.args[1])} gave no line in {timeout} s "
                                   f"(exit code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def recv(self, timeout=60):
        return json.loads(self.line(timeout))

    def send(self, obj):
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, *cmd, timeout=60):
        self.send(list(cmd))
        return self.recv(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self):
        """Asks it to exit; kills it when it does not within 20 s."""
        try:
            if self.proc.poll() is None:
                self.send(["exit"])
                self.proc.wait(20)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            pass
        finally:
            self.kill()


class Peer(Child):
    """A peer.py process: .name, .addr, .len of its registered memory."""

    def __init__(self, memory="alloc", nbytes=1 << 20, options=None, env=None, read_only=False):
        args = [sys.executable, os.path.join(HERE, "peer.py"), "--memory", memory, "--bytes", str(nbytes)]
        if read_only:
            args.append("--read-only")
        for k, v in (options or {}).items():
            args += ["--option", f"{k}={v}"]
        super().__init__(args, env)
        hello = self.recv(30)
        self.name, self.addr, self.len = hello["name"], hello["addr"], hello["len"]

    def sha(self, offset, length):
        return self.call("sha", offset, length)["sha"]


@pytest.fixture
def make_peer():
    peers = []

    def make(**kwargs):
        peers.append(Peer(**kwargs))
        return peers[-1]

    yield make
    for p in peers:
        p.close()


@pytest.fixture(params=list(TRANSPORTS))
def transport(request, monkeypatch):
    """(name, settings); ucx runs over UCX's tcp transport (UCX_TLS=tcp, the peer inherits it)."""
    if request.param == "ucx":
        monkeypatch.setenv("UCX_TLS", "tcp")
        try:
            xfer.Engine("127.0.0.1", transport="ucx").close()
        except xfer.UnsupportedError as e:
            pytest.skip(f"no ucx here: {e}")
    return request.param, TRANSPORTS[request.param]


@pytest.fixture
def pair(transport, make_peer):
    """(engine, peer) over the transport; the engine is connected to the peer."""
    name, t = transport
    peer = make_peer(memory=t["memory"], nbytes=64 << 20, options=t["options"])
    with xfer.Engine("127.0.0.1", **t["options"]) as engine:
        engine.connect(peer.name)
        yield engine, peer, t["route"]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd(tmp_path):
    """A real etcd on free loopback ports with a temporary data directory: its etcd:// URL.
    Skips when etcd is not installed or this build has no cluster metadata (libcurl)."""
    binary = "/usr/bin/etcd"
    if not os.access(binary, os.X_OK):
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    try:
        xfer.Engine("127.0.0.1", metadata="etcd://127.0.0.1:1").close()
    except xfer.UnsupportedError as e:
        pytest.skip(str(e))
    except xfer.XferError:
        pass  # (etcd unreachable there: the build has it)
    client, peer = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"
    log = open(tmp_path / "etcd.log", "w+")
    proc = subprocess.Popen([binary, "--name", "t", "--data-dir", str(tmp_path / "data"),
                             "--listen-client-urls", client, "--advertise-client-urls", client,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"t={peer}"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while "serving insecure client requests" not in (tmp_path / "etcd.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.02)
        yield "etcd://" + client[len("http://"):] + "/pytest"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


class _MetadataHandler(http.server.BaseHTTPRequestHandler):
    """Mooncake's HTTP metadata protocol, as its mooncake_http_metadata_server speaks it: GET,
    PUT and DELETE of /metadata?key=KEY; the value is the body; 404 for a key it does not hold."""

    def _key(self):
        url = urllib.parse.urlparse(self.path)
        keys = urllib.parse.parse_qs(url.query).get("key")
        return keys[0] if url.path == "/metadata" and keys else None

    def _answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        value = self.server.store.get(self._key())
        self._answer(200, value) if value is not None else self._answer(404, b"metadata not found")

    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self._key()
        if key is None:
            return self._answer(400, b"metadata key is required")
        self.server.store[key] = body
        self._answer(200, b"metadata updated")

    def do_DELETE(self):
        found = self.server.store.pop(self._key(), None) is not None
        self._answer(200 if found else 404)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_metadata():
    """A real HTTP metadata server (Mooncake's protocol) on a free loopback port: (its URL, its
    store, a dict of key -> bytes)."""
    try:
        xfer.Engine("127.0.0.1", metadata="http://127.0.0.1:1/metadata").close()
    except xfer.UnsupportedError as e:
        pytest.skip(str(e))
    except xfer.XferError:
        pass  # (nobody there: the build has it)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetadataHandler)
    server.store = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metadata", server.store
    finally:
        server.shutdown()
        server.server_close()
