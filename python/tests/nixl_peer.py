"""The two peers of NIXL's blocking send/receive example (examples/python in NIXL), written
against NIXL's own module names: the target registers two tensors and, once the initiator's
metadata came through its listener, sends it their descriptors as a notification; the
initiator READs them with a "UUID" notification, and checks the bytes. Every wait is bounded.

    nixl_peer.py target --port P          prints {"port": P} once listening, then {"ok": ...}
    nixl_peer.py initiator --port P       prints {"ok": ...}
--impl nixl runs NIXL's own module instead of xfer.nixl (bench/compare scripts)."""

import argparse
import json
import time


def wait_for(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.001)


def target(agent_type, config_type, port, torch):
    agent = agent_type("target", config_type(True, True, port))
    tensors = [torch.ones(4096, dtype=torch.float32) * (k + 1) for k in range(2)]
    reg_descs = agent.register_memory(tensors)
    # (NIXL 1.5 has no get_listen_port: its listener is on the port given.)
    print(json.dumps({"port": getattr(agent, "get_listen_port", lambda: port)()}), flush=True)
    target_descs = agent.get_serialized_descs(reg_descs.trim())
    wait_for("initiator metadata", lambda: agent.check_remote_metadata("initiator"))
    agent.send_notif("initiator", target_descs)
    wait_for("the initiator's UUID notification", lambda: agent.check_remote_xfer_done("initiator", b"UUID"))
    agent.deregister_memory(reg_descs)
    return True


def initiator(agent_type, config_type, port, torch):
    agent = agent_type("initiator", config_type(True, True, 0))
    tensors = [torch.zeros(4096, dtype=torch.float32) for _ in range(2)]
    reg_descs = agent.register_memory(tensors)
    agent.fetch_remote_metadata("target", "127.0.0.1", port)
    agent.send_local_metadata("127.0.0.1", port)
    notifs = wait_for("the target's descriptors", lambda: agent.get_new_notifs().get("target"))
    target_descs = agent.deserialize_descs(notifs[0])
    wait_for("target metadata", lambda: agent.check_remote_metadata("target"))
    handle = agent.initialize_xfer("READ", reg_descs.trim(), target_descs, "target", "UUID")
    state = agent.transfer(handle)
    assert state in ("DONE", "PROC"), state
    wait_for("the READ", lambda: agent.check_xfer_state(handle) == "DONE")
    ok = all(bool((t == k + 1).all()) for k, t in enumerate(tensors))
    agent.remove_remote_agent("target")
    agent.release_xfer_handle(handle)
    agent.invalidate_local_metadata("127.0.0.1", port)
    agent.deregister_memory(reg_descs)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["target", "initiator"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--impl", choices=["xfer", "nixl"], default="xfer")
    a = p.parse_args()
    if a.impl == "xfer":
        import xfer.nixl
        xfer.nixl.install()
    import torch
    from nixl._api import nixl_agent, nixl_agent_config
    run = target if a.mode == "target" else initiator
    print(json.dumps({"ok": run(nixl_agent, nixl_agent_config, a.port, torch)}), flush=True)


if __name__ == "__main__":
    main()
