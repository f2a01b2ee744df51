"""Fixtures: a peer process (peer.py) and the transports the tests run over."""

import json
import os
import select
import subprocess
import sys

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


class Peer:
    """A peer.py process: .name, .addr, .len of its registered memory; .call(cmd...)."""

    def __init__(self, memory="alloc", nbytes=1 << 20, options=None, env=None):
        args = [sys.executable, os.path.join(HERE, "peer.py"), "--memory", memory, "--bytes", str(nbytes)]
        for k, v in (options or {}).items():
            args += ["--option", f"{k}={v}"]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        hello = self._read(30)
        self.name, self.addr, self.len = hello["name"], hello["addr"], hello["len"]

    def _read(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            raise RuntimeError(f"peer.py gave no answer in {timeout} s (exit code {self.proc.poll()})")
        return json.loads(line)

    def call(self, *cmd, timeout=60):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def sha(self, offset, length):
        return self.call("sha", offset, length)["sha"]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('["exit"]\n')
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


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
