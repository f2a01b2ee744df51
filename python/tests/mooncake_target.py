"""A Mooncake-style target: it only initializes its TransferEngine and waits. Prints
{"rc", "segment"} (host:port; with --metadata, --host); then answers ["notifies"] with its get_notifies() and ends on ["exit"] or
end of input. --impl mooncake runs Mooncake's own engine instead (bench/compare_mooncake.sh)."""

import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["xfer", "mooncake"], default="xfer")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--metadata", default="P2PHANDSHAKE",
                   help="a metadata server (etcd): --host is then the segment name, published there")
    p.add_argument("--allocate", type=int, default=0,
                   help="allocate_managed_buffer this many bytes after initialize (Mooncake "
                        "registers nothing before: its get_first_buffer_address would be 0)")
    a = p.parse_args()
    if a.impl == "xfer":
        from xfer.mooncake import TransferEngine
    else:
        from mooncake.engine import TransferEngine
    engine = TransferEngine()
    rc = engine.initialize(a.host, a.metadata, "tcp", "")
    if rc == 0 and a.allocate:
        rc = 0 if engine.allocate_managed_buffer(a.allocate) else -1
    segment = f"{a.host}:{engine.get_rpc_port()}" if a.metadata == "P2PHANDSHAKE" else a.host
    print(json.dumps({"rc": rc, "segment": segment}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd[0] == "exit":
            break
        if cmd[0] == "notifies":
            print(json.dumps([[n.name, n.msg] for n in engine.get_notifies()]), flush=True)


if __name__ == "__main__":
    main()
