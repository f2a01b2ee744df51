"""examples/python/ run as a user runs them: the target first, then the initiator at the
address the target printed; both exit 0."""

import os
import re
import subprocess
import sys

import pytest

from conftest import Child

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")


@pytest.mark.parametrize("program, target, initiator", [
    ("kv_read_free.py", "prefill", "decode"),
    ("kv_write_ready.py", "decode", "prefill"),
    ("nixl_read_free.py", "prefill", "decode"),
])
def test_example_pair(program, target, initiator):
    path = os.path.join(EXAMPLES, program)
    server = Child([sys.executable, path, target, "127.0.0.1:0"])
    try:
        first = server.line(30)
        address = re.search(r"127\.0\.0\.1:\d+", first)
        assert address, f"the {target} side printed no address: {first!r}"
        client = subprocess.run([sys.executable, path, initiator, address.group(0)], capture_output=True,
                                text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        last = server.line(60)
        assert server.proc.wait(30) == 0, last
        assert "blocks reused" in last or "hold the request" in last, last
    finally:
        server.kill()
