"""Metrics from Python: Engine.metrics() follows what moved over every transport, the
metrics_listen endpoint parses as the Prometheus exposition format (prometheus_client's parser,
promtool's linter), and a real Prometheus scrapes an engine during transfers."""

import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import json

import numpy as np
import pytest

import xfer
from conftest import _free_port


def _fetch(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def test_metrics_count_what_moved(pair):
    engine, peer, route = pair
    block, writes = 16 << 10, 100
    src = np.full(block * 8, 7, np.uint8)
    for _ in range(writes):
        engine.write(peer.name, [(src.ctypes.data, peer.addr, block)])
    engine.read(peer.name, [(src.ctypes.data + i * block, peer.addr + i * block, block) for i in range(8)])
    m = engine.metrics()
    assert m.sum("xfer_transferred_bytes_total", op="write", backend=route, peer=peer.name) == writes * block
    assert m.sum("xfer_transferred_bytes_total", op="read", backend=route) == 8 * block
    assert m.sum("xfer_requests_total", status="ok") == writes + 1
    assert m.sum("xfer_request_descriptors", op="read") == 1
    [read_descs] = [s for s in m["xfer_request_descriptors"].samples if s.labels["op"] == "read"]
    assert read_descs.sum == 8 and read_descs.buckets[3] == (8.0, 1)  # (bounds 1, 2, 4, 8, ...)
    assert m["xfer_request_duration_seconds"].type == "histogram"
    assert m.sum("xfer_requests_in_flight") == 0
    assert "xfer_transferred_bytes_total" in m and "no_such_metric" not in m
    with pytest.raises(KeyError):
        m.sum("no_such_metric")


def test_failures_and_options():
    with xfer.Engine("127.0.0.1:0", metrics=False) as engine:
        buf = engine.alloc(1 << 20)
        engine.write(engine.name, [(buf.addr, buf.addr + 4096, 4096)])
        with pytest.raises(xfer.RemoteAccessDeniedError):
            engine.write(engine.name, [(buf.addr, buf.addr + (1 << 20), 4096)])
        m = engine.metrics()
        assert m.sum("xfer_transferred_bytes_total") == 0  # (not counted: metrics=False)
        assert m.sum("xfer_requests_refused_total", op="write", status="remote_access_denied") == 1
        assert engine.metrics_address == ""
    with pytest.raises(xfer.InvalidArgumentError, match="metrics_listen"):
        xfer.Engine("127.0.0.1:0", metrics_listen="no-port")
    with pytest.raises(xfer.InvalidArgumentError, match="metrics_max_peers"):
        xfer.Engine("127.0.0.1:0", metrics_max_peers=0)


@pytest.fixture
def served():
    """An engine serving its metrics, with a peer engine of its own to transfer to."""
    try:
        xfer.Engine("127.0.0.1:0", metrics_listen="127.0.0.1:0").close()
    except xfer.UnsupportedError as e:
        pytest.skip(str(e))
    with xfer.Engine("127.0.0.1:0", metrics_listen="127.0.0.1:0", transport="tcp") as engine, \
            xfer.Engine("127.0.0.1:0") as target:
        region = target.alloc(1 << 20)
        engine.connect(target.name)
        yield engine, target, region


def test_endpoint_parses_as_the_exposition_format(served):
    parser = pytest.importorskip("prometheus_client.parser", reason="apt-get install python3-prometheus-client")
    engine, target, region = served
    src = np.arange(1 << 20, dtype=np.uint8)
    engine.write(target.name, [(src.ctypes.data, region.addr, 1 << 20)], notify=b'say "hi"\n')
    with pytest.raises(xfer.RemoteAccessDeniedError):
        engine.read(target.name, [(src.ctypes.data, region.addr + 4096, 1 << 20)])
    status, ctype, body = _fetch(f"http://{engine.metrics_address}/metrics")
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in parser.text_string_to_metric_families(body)}
    snapshot = engine.metrics()
    assert set(families) == {name[:-len("_total")] if name.endswith("_total") else name for name in snapshot}
    moved = families["xfer_transferred_bytes"]
    assert moved.type == "counter"
    [sample] = moved.samples
    assert sample.labels == {"op": "write", "backend": "tcp", "peer": target.name}
    assert sample.value == 1 << 20
    duration = families["xfer_request_duration_seconds"]
    buckets = [s for s in duration.samples if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 1
    assert families["xfer_requests_refused"].samples[0].labels["status"] == "remote_access_denied"
    assert families["xfer_notifications_sent"].samples[0].value == 1
    if shutil.which("promtool"):  # Prometheus' own linter: format and naming conventions
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    with pytest.raises(urllib.error.HTTPError) as e:
        _fetch(f"http://{engine.metrics_address}/other")
    assert e.value.code == 404


@pytest.fixture
def prometheus(tmp_path, served):
    """A real Prometheus on a free loopback port, scraping the served engine every 500 ms, with a
    temporary configuration and data directory: its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (apt-get install prometheus)")
    engine = served[0]
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 500ms
  scrape_timeout: 500ms
scrape_configs:
  - job_name: xfer
    static_configs:
      - targets: ["{engine.metrics_address}"]
""")
    web = f"127.0.0.1:{_free_port()}"
    log = open(tmp_path / "prometheus.log", "w+")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address={web}"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "Prometheus exited: " + (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus did not become ready in 30 s"
            try:
                if _fetch(f"http://{web}/-/ready", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        yield f"http://{web}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _query(base, promql):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    answer = json.loads(_fetch(url)[2])
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_the_engine_during_transfers(served, prometheus):
    engine, target, region = served
    src = np.ones(1 << 20, np.uint8)
    stop = threading.Event()
    moved = [0]

    def transfer():
        while not stop.is_set() and moved[0] < (4 << 30):
            engine.write(target.name, [(src.ctypes.data, region.addr, 1 << 20)])
            moved[0] += 1 << 20
            time.sleep(0.002)

    writer = threading.Thread(target=transfer)
    writer.start()
    try:
        seen = []  # the byte counter as Prometheus stored it, while bytes moved
        deadline = time.monotonic() + 30
        while len(set(seen)) < 3 and time.monotonic() < deadline:
            result = _query(prometheus, 'sum(xfer_transferred_bytes_total{op="write",backend="tcp"})')
            if result:
                seen.append(float(result[0]["value"][1]))
            time.sleep(0.2)
        assert len(set(seen)) >= 3, f"Prometheus never saw the counter move: {seen}"
        assert seen == sorted(seen)
    finally:
        stop.set()
        writer.join()
    # After the transfers: Prometheus's value is the engine's, to the byte.
    deadline = time.monotonic() + 30
    while True:
        result = _query(prometheus, 'sum(xfer_transferred_bytes_total{job="xfer"})')
        if result and float(result[0]["value"][1]) == moved[0]:
            break
        assert time.monotonic() < deadline, f"Prometheus has {result}, the engine moved {moved[0]}"
        time.sleep(0.2)
    assert engine.metrics().sum("xfer_transferred_bytes_total") == moved[0]
    up = _query(prometheus, 'max_over_time(up{job="xfer"}[10s])')
    assert up and up[0]["value"][1] == "1", "Prometheus never scraped the engine successfully"
