"""vLLM's disaggregated flow, written against NIXL's Python agent and run on xfer.nixl: the
decode side READs a request's KV blocks from the prefill side by block ids (prepped descriptor
lists, as vLLM's NixlConnector does) with a notification "req-7:1"; the prefill side learns
from the notification alone that the blocks were read and reuses them at once.

The metadata goes through the prefill agent's listener (the decode side fetches it and sends
its own), and the prefill side sends its block table as a notification, as NIXL's examples do.
Change the import below to `from nixl._api import ...` and it runs on NIXL (give the prefill
side a port other than 0: NIXL 1.5 cannot say which free port it took).

    terminal 1:  python nixl_read_free.py prefill 127.0.0.1:5555   (exits after one request)
    terminal 2:  python nixl_read_free.py decode  127.0.0.1:5555
"""

import os
import sys
import time

import numpy as np

from xfer.nixl import nixl_agent, nixl_agent_config

BLOCK, BLOCKS = 64 << 10, 64
REQUEST = np.arange(17, 43)  # the request's blocks on the prefill side


def wait_for(what, cond, timeout=60):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            sys.exit(f"no {what} within {timeout} s")
        time.sleep(0.001)
    return got


def prefill(host, port):
    os.environ.setdefault("XFER_NIXL_HOST", host)  # (where xfer.nixl agents listen)
    agent = nixl_agent("prefill", nixl_agent_config(True, True, port))
    kv = np.repeat(np.arange(BLOCKS, dtype=np.uint8), BLOCK).reshape(BLOCKS, BLOCK)  # block b: bytes b
    reg = agent.register_memory([(kv.ctypes.data, kv.nbytes, 0, "kv")], "DRAM")
    port = port or agent.get_listen_port()  # (port 0: a free one, which the agent says)
    print(f"prefill: {BLOCKS} blocks, listening at {host}:{port}", flush=True)
    wait_for("decode metadata", lambda: agent.check_remote_metadata("decode"))
    table = [(kv.ctypes.data + b * BLOCK, BLOCK, 0) for b in range(BLOCKS)]
    agent.send_notif("decode", agent.get_serialized_descs(agent.get_xfer_descs(table, "DRAM")))
    note = wait_for("the decode side's notification", lambda: agent.get_new_notifs().get("decode"))[0]
    kv[REQUEST] = 0xFF  # the READ is over: reuse the blocks at once
    print(f"prefill: decode says '{note.decode()}': blocks reused ({REQUEST[0]}-{REQUEST[-1]})")
    agent.deregister_memory(reg)


def decode(host, port):
    os.environ.setdefault("XFER_NIXL_HOST", host)
    agent = nixl_agent("decode", nixl_agent_config(True, True, 0))
    cache = np.zeros((len(REQUEST), BLOCK), np.uint8)
    reg = agent.register_memory([(cache.ctypes.data, cache.nbytes, 0, "cache")], "DRAM")
    agent.fetch_remote_metadata("prefill", host, port)
    agent.send_local_metadata(host, port)
    table = agent.deserialize_descs(wait_for("the block table", lambda: agent.get_new_notifs().get("prefill"))[0])
    wait_for("prefill metadata", lambda: agent.check_remote_metadata("prefill"))
    mine = [(cache.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(len(REQUEST))]
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", mine, "DRAM")
    remote = agent.prep_xfer_dlist("prefill", table)
    # Done = every block is here and the prefill side has the notification.
    handle = agent.make_prepped_xfer("READ", local, np.arange(len(REQUEST)), remote, REQUEST,
                                     notif_msg=b"req-7:1")
    agent.transfer(handle)
    wait_for("the READ", lambda: agent.check_xfer_state(handle) == "DONE")
    if not (cache == REQUEST.astype(np.uint8)[:, None]).all():
        sys.exit("decode: wrong data")
    print(f"decode: read blocks {REQUEST[0]}-{REQUEST[-1]}; the prefill side was told 'req-7:1'")
    agent.release_xfer_handle(handle)
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    agent.remove_remote_agent("prefill")
    agent.deregister_memory(reg)


if __name__ == "__main__":
    roles = {"prefill": prefill, "decode": decode}
    if len(sys.argv) != 3 or sys.argv[1] not in roles:
        sys.exit(f"usage: {sys.argv[0]} prefill HOST:PORT | decode HOST:PORT")
    host, _, port = sys.argv[2].rpartition(":")
    roles[sys.argv[1]](host, int(port))
