"""examples/python/ run as a user runs them: the target first, then the initiator at the
address the target printed; both exit 0."""

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")


@pytest.mark.parametrize("program, target, initiator", [
    ("kv_read_free.py", "prefill", "decode"),
    ("kv_write_ready.py", "decode", "prefill"),
])
def test_example_pair(program, target, initiator):
    path = os.path.join(EXAMPLES, program)
    server = subprocess.Popen([sys.executable, path, target, "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()
        address = re.search(r"127\.0\.0\.1:\d+", first)
        assert address, f"the {target} side printed no address: {first!r}"
        client = subprocess.run([sys.executable, path, initiator, address.group(0)], capture_output=True,
                                text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        rest = server.communicate(timeout=60)[0]
        assert server.returncode == 0, rest
        assert "blocks reused" in rest or "hold the request" in rest, rest
    finally:
        if server.poll() is None:
            server.kill()
