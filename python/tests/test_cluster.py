"""Cluster metadata from Python with a real etcd: engines found by cluster name, listed with
their region tags, gone from the list when killed."""

import time

import numpy as np
import pytest

import xfer


def test_engines_find_each_other_by_name_and_a_killed_one_leaves_the_list(etcd, make_peer):
    prefill = make_peer(memory="register", options={"metadata": etcd, "cluster_name": "prefill-0",
                                                    "heartbeat_timeout": 2.0, "heartbeat_interval": 0.2})
    prefill.call("fill", 0, 4096, 42)
    with xfer.Engine("127.0.0.1:0", metadata=etcd, cluster_name="decode-0") as decode:
        decode.connect("prefill-0")
        back = np.zeros(4096, np.uint8)
        decode.read("prefill-0", [(back.ctypes.data, prefill.addr, 4096)])
        assert (back == 42).all()
        assert decode.peer_info("prefill-0").name == prefill.name
        peers = {p.name: p for p in decode.list_peers()}
        assert set(peers) == {"prefill-0", "decode-0"}
        assert peers["prefill-0"].address == prefill.name and peers["prefill-0"].tags == ["pool"]
        assert peers["decode-0"].address == decode.name
        assert repr(peers["prefill-0"]) == f"<xfer.ClusterPeer prefill-0 at {prefill.name}>"

        prefill.kill()
        killed = time.monotonic()
        while "prefill-0" in {p.name for p in decode.list_peers()}:
            assert time.monotonic() - killed < 10, "a killed engine stayed listed"
            time.sleep(0.05)
        assert time.monotonic() - killed < 4  # (its lease: the heartbeat timeout, 2 s)

        with pytest.raises(xfer.NotConnectedError, match="no engine named 'nobody'"):
            decode.connect("nobody")


def test_an_http_metadata_server_finds_engines_by_name(http_metadata, make_peer):
    """Mooncake's HTTP metadata protocol as the metadata service: engines publish and find each
    other by name; it cannot list; a clean close withdraws the entry."""
    url, store = http_metadata
    prefill = make_peer(memory="register", options={"metadata": url, "cluster_name": "prefill-0"})
    prefill.call("fill", 0, 4096, 42)
    with xfer.Engine("127.0.0.1:0", metadata=url, cluster_name="decode-0") as decode:
        decode.connect("prefill-0")
        back = np.zeros(4096, np.uint8)
        decode.read("prefill-0", [(back.ctypes.data, prefill.addr, 4096)])
        assert (back == 42).all()
        assert decode.peer_info("prefill-0").name == prefill.name
        assert b'"address":"%s"' % decode.name.encode() in store["xfer/engines/decode-0"]
        with pytest.raises(xfer.UnsupportedError, match="cannot list"):
            decode.list_peers()
    assert "xfer/engines/decode-0" not in store
    with pytest.raises(xfer.InvalidArgumentError, match="the key goes there"):
        xfer.Engine("127.0.0.1:0", metadata=url + "?key=x", cluster_name="q")


def test_cluster_options_are_checked(etcd):
    with pytest.raises(xfer.InvalidArgumentError, match="cluster_name needs metadata"):
        xfer.Engine("127.0.0.1:0", cluster_name="alone")
    with pytest.raises(xfer.InvalidArgumentError, match="cluster name 'a:b'"):
        xfer.Engine("127.0.0.1:0", metadata=etcd, cluster_name="a:b")
    with xfer.Engine("127.0.0.1:0") as plain:
        with pytest.raises(xfer.InvalidArgumentError, match="needs EngineOptions::metadata"):
            plain.list_peers()
    with xfer.Engine("127.0.0.1:0", metadata="etcd://127.0.0.1:1", cluster_name="late",
                     start_without_metadata=True) as late:
        with pytest.raises(xfer.NotConnectedError, match="etcd unreachable"):
            late.list_peers()


def test_connect_async_to_many_peers_from_one_thread(etcd, make_peer):
    peers = [make_peer(options={"metadata": etcd, "cluster_name": f"prefill-{i}"}) for i in range(4)]
    with xfer.Engine("127.0.0.1:0", metadata=etcd) as engine:
        pending = [engine.connect_async(f"prefill-{i}", timeout=10) for i in range(4)]
        pending.append(engine.connect_async("nobody", timeout=10))
        for c in pending[:4]:
            c.wait(30)
            assert c.done() and "connected" in repr(c)
        with pytest.raises(xfer.NotConnectedError, match="no engine named 'nobody'"):
            pending[4].wait(30)
        with pytest.raises(xfer.AlreadyConnectedError):  # (the same peer, by address)
            engine.connect_async(peers[0].name, timeout=10).wait(30)
        for p in peers:
            back = np.zeros(64, np.uint8)
            p.call("fill", 0, 64, 7)
            engine.read(p.name, [(back.ctypes.data, p.addr, 64)])
            assert (back == 7).all()
