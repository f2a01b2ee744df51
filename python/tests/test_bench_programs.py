"""The benchmark programs that drive the drop-ins (bench/nixl_style.py, bench/mooncake_style.py:
bench/compare_nixl.sh and bench/compare_mooncake.sh run them against the peers' wheels) still
run on xfer, briefly: every step brings the target's bytes. They reach into the drop-ins'
internals for their "direct" baselines, so a change of those breaks them."""

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def run(program, *args, env=None):
    out = subprocess.run([sys.executable, os.path.join(BENCH, program), *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("impl", ["xfer", "direct"])
def test_nixl_style_reads_the_targets_bytes(impl):
    result = run("nixl_style.py", "--impl", impl, "--sizes", "4096,65536", "--count", "16", "--bytes", str(1 << 20),
                 env={"XFER_NIXL_HOST": "127.0.0.1"})
    assert [s["size"] for s in result["steps"]] == [4096, 65536]
    assert all(s["data_equal"] and s["gbps"] > 0 for s in result["steps"])


def test_mooncake_style_steps_agree():
    result = run("mooncake_style.py", "--impl", "xfer", "--sizes", "4096", "--bytes", str(1 << 20))
    steps = result["steps"]
    assert steps and all(s["rc"] == 0 or s["step"].startswith("write outside") for s in steps)
    assert all(s["data_equal"] for s in steps if "data_equal" in s)
